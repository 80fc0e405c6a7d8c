"""`manage.py run_worker` as a real process: killed mid-delivery, and stopped with SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from delivery.models import DeliveryAttempt, Outcome
from notifications.models import Notification, Status
from tests.support.factories import ClientFactory, NotificationFactory

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]


def worker_process(database_url: str, provider_url: str, *args: str, **env: str):
    environment = {
        **os.environ,
        "DATABASE_URL": database_url,
        "NOTIFYQUEUE_EMAIL_PROVIDER": "http",
        "NOTIFYQUEUE_EMAIL_PROVIDER_URL": provider_url,
        "NOTIFYQUEUE_WEBHOOK_ALLOW_PRIVATE": "true",
        "NOTIFYQUEUE_POLL_INTERVAL_SECONDS": "0.1",
        "NOTIFYQUEUE_HEARTBEAT_SECONDS": "0.2",
        **env,
    }
    return subprocess.Popen(
        [sys.executable, "manage.py", "run_worker", *args],
        cwd=ROOT,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_for(predicate, timeout_s: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def test_worker_killed_after_the_provider_accepted_is_sent_once_after_its_claim_expires(
    loopback, database_url
):
    notification = NotificationFactory(client=ClientFactory(), metadata={"order": "A-17"})
    loopback.hold = True  # the provider accepts, then the worker dies before hearing back
    first = worker_process(
        database_url,
        loopback.url,
        "--concurrency",
        "1",
        NOTIFYQUEUE_CLAIM_TIMEOUT_SECONDS="1",
        NOTIFYQUEUE_PROVIDER_TIMEOUT_SECONDS="0.5",
    )
    try:
        assert loopback.received.wait(20), "the first worker never called the provider"
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=10)
    notification.refresh_from_db()
    assert notification.status == Status.PROCESSING  # nothing was recorded
    loopback.hold = False
    loopback.release.set()

    time.sleep(1.1)  # let the dead worker's claim expire
    second = worker_process(
        database_url,
        loopback.url,
        "--until-empty",
        NOTIFYQUEUE_CLAIM_TIMEOUT_SECONDS="1",
        NOTIFYQUEUE_PROVIDER_TIMEOUT_SECONDS="0.5",
    )
    output, _ = second.communicate(timeout=30)
    assert second.returncode == 0, output

    notification.refresh_from_db()
    assert (notification.status, notification.attempt_count) == (Status.SENT, 2)
    key = f"{notification.id}:email"
    assert [call.key for call in loopback.calls] == [key, key]  # the same key both times
    assert loopback.calls[0].body == {
        "id": str(notification.id),
        "channel": "email",
        "recipient": notification.recipient,
        "subject": notification.subject,
        "body": notification.body,
        "metadata": {"order": "A-17"},
    }
    assert len(loopback.sent) == 1  # so the provider sent the message once
    attempts = list(DeliveryAttempt.objects.filter(notification=notification).order_by("number"))
    assert [a.outcome for a in attempts] == [Outcome.ABANDONED, Outcome.SENT]
    assert attempts[1].provider_message_id == loopback.sent[key]


def test_a_worker_claims_only_what_it_can_start_and_sigterm_finishes_the_one_in_flight(
    loopback, database_url
):
    """Batch size 5 but one delivery slot: one claim, the other four stay PENDING with no
    attempt used (nothing waits in the worker under a running claim). SIGTERM lets the send in
    flight finish and be recorded, then the process exits 0."""
    client = ClientFactory()
    notifications = NotificationFactory.create_batch(5, client=client)
    loopback.hold = True
    worker = worker_process(database_url, loopback.url, "--concurrency", "1", "--batch-size", "5")
    try:
        assert loopback.received.wait(20), "the worker never called the provider"
        time.sleep(0.5)  # ten poll intervals: time enough to claim more if it would
        assert Notification.objects.filter(status=Status.PROCESSING).count() == 1
        pending = Notification.objects.filter(status=Status.PENDING)
        assert set(pending.values_list("attempt_count", flat=True)) == {0}
        worker.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        assert worker.poll() is None  # still finishing the delivery in flight
    finally:
        loopback.release.set()
    output, _ = worker.communicate(timeout=30)
    assert worker.returncode == 0, output

    statuses = sorted(Notification.objects.values_list("status", flat=True))
    assert statuses == [Status.PENDING] * 4 + [Status.SENT]
    assert len(loopback.calls) == 1
    attempts = DeliveryAttempt.objects.all()
    assert [(a.outcome, a.notification_id in {n.id for n in notifications}) for a in attempts] == [
        (Outcome.SENT, True)
    ]


def test_run_worker_posts_one_signed_webhook_per_final_status(database_url):
    import json

    from standardwebhooks.webhooks import Webhook

    from tests.support.webhook_receiver import WebhookReceiver

    with WebhookReceiver() as receiver:
        client = ClientFactory(webhook_url=receiver.url)
        sent = NotificationFactory(client=client, recipient="ada@example.com")
        failed = NotificationFactory(client=client, recipient="permanent-failure@example.com")
        dead = NotificationFactory(
            client=client, recipient="temporary-failure@example.com", max_attempts=1
        )
        worker = subprocess.run(
            [sys.executable, "manage.py", "run_worker", "--until-empty"],
            cwd=ROOT,
            env={
                **os.environ,
                "DATABASE_URL": database_url,
                "NOTIFYQUEUE_WEBHOOK_ALLOW_PRIVATE": "true",
                "NOTIFYQUEUE_POLL_INTERVAL_SECONDS": "0.1",
            },
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert worker.returncode == 0, worker.stderr
        requests = receiver.wait_for(3)

    verifier = Webhook(client.webhook_secret)
    bodies = {}
    for request in requests:
        headers = {k.lower(): v for k, v in request.headers.items()}
        payload = verifier.verify(request.body, headers)  # raises if the signature is wrong
        assert headers["webhook-id"] == payload["eventId"]
        bodies[payload["jobId"]] = json.loads(request.body)
    assert {job: body["status"] for job, body in bodies.items()} == {
        str(sent.id): "SENT",
        str(failed.id): "FAILED",
        str(dead.id): "DEAD_LETTERED",
    }
    assert set(bodies[str(sent.id)]) == {
        "eventId",
        "jobId",
        "status",
        "attemptCount",
        "timestamp",
        "type",
    }
    assert bodies[str(dead.id)]["attemptCount"] == 1


def test_run_worker_refuses_a_loopback_provider_url_unless_private_targets_are_allowed(
    database_url,
):
    worker = worker_process(
        database_url,
        "http://127.0.0.1:9/send",
        "--until-empty",
        NOTIFYQUEUE_WEBHOOK_ALLOW_PRIVATE="false",
    )
    output, _ = worker.communicate(timeout=30)
    assert worker.returncode != 0
    assert "NOTIFYQUEUE_EMAIL_PROVIDER_URL" in output and "loopback" in output


def test_a_worker_at_concurrency_200_uses_four_connections(database_url):
    """Two hundred sends in flight at once (the provider answers after 0.5 s), yet the worker
    holds four PostgreSQL sessions (its loop, its heartbeat, its LISTEN thread, its webhook
    sender), and stays small: the send threads never touch the database."""
    from django.db import connection

    from tests.support.http_servers import ScriptedProvider

    NotificationFactory.create_batch(400, client=ClientFactory())
    with ScriptedProvider(delay_s=0.5) as provider:
        worker = worker_process(
            database_url, provider.url, "--concurrency", "200", "--batch-size", "200"
        )
        peak, peak_rss_kb = 0, 0
        try:
            sent = Notification.objects.filter(status=Status.SENT)
            deadline = time.monotonic() + 60
            while sent.count() < 400 and time.monotonic() < deadline:
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT count(*) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                        "AND backend_type = 'client backend'"  # not autovacuum
                    )
                    peak = max(peak, cursor.fetchone()[0])
                peak_rss_kb = max(peak_rss_kb, _rss_kb(worker.pid))
                time.sleep(0.05)
            assert sent.count() == 400
        finally:
            worker.send_signal(signal.SIGTERM)
            output, _ = worker.communicate(timeout=30)
    assert worker.returncode == 0, output
    assert len(provider.sends) == 400
    starts = sorted(call.at for call in provider.calls)
    overlapping = max(sum(1 for t in starts if s <= t < s + 0.5) for s in starts)
    assert overlapping >= 100, overlapping  # far more sends at once than connections
    assert peak <= 4, peak
    assert peak_rss_kb < 150 * 1024, peak_rss_kb


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def test_an_idle_run_worker_logs_nothing_while_it_waits(loopback, database_url):
    """`run_worker` (its delivery loop, reaper and webhook sender) over an empty queue for 3 s
    at a 0.1 s poll interval: its log holds what it says when it starts and stops, and not one
    line per idle step (it used to write an INFO line a second)."""
    worker = worker_process(database_url, loopback.url)
    try:
        time.sleep(3)
    finally:
        worker.send_signal(signal.SIGTERM)
    output, _ = worker.communicate(timeout=30)
    assert worker.returncode == 0, output
    lines = output.splitlines()
    assert len(lines) <= 4, lines
    assert not any("delivery claimed=" in line for line in lines), lines
