#!/usr/bin/env python
"""Measures delivery throughput: N due notifications, W worker processes, until all are SENT.

    .venv/bin/python bench/worker_throughput.py --notifications 20000 --workers 2
    .venv/bin/python bench/worker_throughput.py --sql-only   # the claim+finish SQL alone

Uses the configured database (the embedded one unless DATABASE_URL is set) and a client
named `bench`, whose rows it deletes first. Prints its figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "notifyqueue.settings")

import django  # noqa: E402

django.setup()

from django.db import connection  # noqa: E402
from django.utils import timezone  # noqa: E402

from clients.models import Client  # noqa: E402
from delivery.models import Outcome  # noqa: E402
from delivery.repositories import DeliveryRepository, Finish  # noqa: E402
from notifications.models import Status  # noqa: E402

INSERT = """
INSERT INTO notification (id, client_id, idempotency_key, request_fingerprint, channel,
    recipient, subject, body, priority, metadata, fallback_channels, status, send_at, due_at,
    attempt_count, max_attempts, operator_retries, created_at, updated_at)
SELECT gen_random_uuid(), %s, 'bench-' || g, '', 'email', 'user' || g || '@example.com', 'Hi',
    'Body', g %% 4, '{}', '[]', 'PENDING', now(), now(), 0, 6, 0, now(), now()
FROM generate_series(1, %s) AS g
"""


def reset(count: int) -> Client:
    client, _ = Client.objects.get_or_create(name="bench")
    with connection.cursor() as cursor:
        for table in ("webhook_event", "delivery_attempt", "inbox_message", "ratelimit_delivery"):
            cursor.execute(
                f"DELETE FROM {table} WHERE notification_id IN "
                "(SELECT id FROM notification WHERE client_id = %s)",
                [client.id],
            )
        cursor.execute("DELETE FROM notification WHERE client_id = %s", [client.id])
        cursor.execute("DELETE FROM simulated_provider_message")
        cursor.execute(INSERT, [client.id, count])
        cursor.execute("ANALYZE notification")
    return client


def bench_workers(args) -> None:
    reset(args.notifications)
    command = [
        sys.executable,
        str(ROOT / "manage.py"),
        "run_worker",
        "--until-empty",
        "--concurrency",
        str(args.concurrency),
        "--batch-size",
        str(args.batch_size),
    ]
    env = {**os.environ, "LOG_LEVEL": "WARNING"}
    started = time.perf_counter()
    workers = [
        subprocess.Popen(command, cwd=ROOT, env=env, stderr=subprocess.DEVNULL)
        for _ in range(args.workers)
    ]
    for worker in workers:
        worker.wait()
    elapsed = time.perf_counter() - started
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM notification WHERE idempotency_key LIKE 'bench-%%' "
            "AND status = 'SENT'"
        )
        (sent,) = cursor.fetchone()
    print(
        f"workers={args.workers} concurrency={args.concurrency} batch={args.batch_size} "
        f"sent={sent}/{args.notifications} elapsed={elapsed:.2f}s "
        f"throughput={sent / elapsed:,.0f} notifications/s (includes process start-up)"
    )


def bench_sql(args) -> None:
    reset(args.notifications)
    repo = DeliveryRepository()
    done = 0
    started = time.perf_counter()
    while True:
        now = timezone.now()
        claims = repo.notification_claim_due(
            worker="bench", limit=args.batch_size, now=now, claim_timeout_s=300
        )
        if not claims:
            break
        repo.notification_finish(
            [
                Finish(c.id, c.claim_token, Status.SENT, Outcome.SENT, message_id="m")
                for c in claims
            ],
            now=now,
        )
        done += len(claims)
    elapsed = time.perf_counter() - started
    print(
        f"claim+finish SQL, one connection, batch={args.batch_size}: {done} rows in "
        f"{elapsed:.2f}s = {done / elapsed:,.0f} rows/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notifications", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--sql-only", action="store_true")
    args = parser.parse_args()
    (bench_sql if args.sql_only else bench_workers)(args)


if __name__ == "__main__":
    main()
