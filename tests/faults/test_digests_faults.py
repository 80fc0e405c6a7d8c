"""Digests tried as their enemies would: real `run_worker` processes close buckets of
thousands while one of them is SIGKILLed in the middle of a close, and a client cancels by key
and creates into the next window meanwhile. Ends with the universal check (DIGESTED is final
and never sent itself) and the digests' own: each collected notification in exactly one digest,
each digest created and sent once."""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta

import pytest
from django.db import connection

from notifications import services
from notifications.models import DigestState, Notification, NotificationDigest, Status
from notifications.services import NotificationRequest
from preferences.routing import NotificationContent
from templates.services import template_put
from tests.faults.harness import (
    Workers,
    all_final,
    universal_check,
    wait_until,
    webhook_reports,
)
from tests.support.clock import database_now
from tests.support.http_servers import ScriptedProvider

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BUCKETS = 3
ROWS = 1500


def digest_create(client, key: str, recipient: str, **fields):
    return services.notification_create(
        client_id=client.id,
        idempotency_key=key,
        request=NotificationRequest(
            channel="email",
            recipient=recipient,
            template="comment",
            payload={"who": key},
            digest_key="thread",
            digest_window_seconds=3,
            **fields,
        ),
        renderer=NotificationContent(),
        max_pending=10**9,
    ).notification


def rows_collect(client, bucket: NotificationDigest, count: int) -> None:
    """`count` rows collected into `bucket` at once, as its creates would have left them."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO notification (
                id, client_id, idempotency_key, request_fingerprint, channel, recipient,
                subject, body, priority, metadata, fallback_channels, template, payload,
                status, send_at, due_at, attempt_count, max_attempts, operator_retries,
                created_at, updated_at, digest_bucket_id, digest_closes_at)
            SELECT notifyqueue_uuid7(), %(client)s, %(bucket)s || '-' || g, 'f', 'email',
                   %(recipient)s, 'Item ' || g, 'b', 2, '{}', '[]', 'comment', '{"who": "w"}',
                   'PENDING', now(), '9999-01-01T00:00:00Z', 0, 4, 0, now(), now(),
                   %(bucket)s, %(closes)s
              FROM generate_series(1, %(count)s) AS g
            """,
            {
                "client": client.id,
                "bucket": bucket.id,
                "recipient": bucket.recipient,
                "closes": bucket.closes_at,
                "count": count,
            },
        )
        cursor.execute(
            "UPDATE notification_digest SET collected = collected + %s WHERE id = %s",
            [count, bucket.id],
        )


def closing_pid() -> int | None:
    """The pid of a worker holding a bucket whose close has begun (rows DIGESTED, not CLOSED)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT h.pid FROM notification_digest AS d
              JOIN worker_heartbeat AS h ON h.worker_id = d.claimed_by
             WHERE d.state = 'CLOSING'
               AND EXISTS (SELECT 1 FROM notification AS n
                            WHERE n.digest_bucket_id = d.id AND n.status = 'DIGESTED')
             LIMIT 1
            """
        )
        found = cursor.fetchone()
    return found[0] if found else None


def test_a_worker_killed_mid_close_leaves_its_bucket_to_another_and_each_row_is_digested_once(
    database_url, client, webhooks
):
    template_put(
        client_id=client.id,
        event="comment",
        channel="email",
        subject="{who}",
        body="{digest_count} new:\n{digest_items}",
        now=database_now(),
    )
    env = {"NOTIFYQUEUE_WORKER_DEAD_AFTER_SECONDS": "1", "NOTIFYQUEUE_HEARTBEAT_SECONDS": "0.2"}
    with ScriptedProvider() as provider, Workers(database_url, provider.url, **env) as workers:
        for n in range(BUCKETS):
            digest_create(client, f"open-{n}", f"u{n}@example.com")
        cancelled = [
            digest_create(client, f"c-{n}", f"u{n}@example.com", cancellation_key="drop")
            for n in range(BUCKETS)
        ]
        for bucket in NotificationDigest.objects.all():
            rows_collect(client, bucket, ROWS)
        assert services.notifications_cancel_by_key(
            client_id=client.id, cancellation_key="drop"
        ) == len(cancelled)
        for _ in range(3):
            workers.start()
        # Kill a worker as soon as one is caught mid-close (its buckets' rows partly marked).
        killed = None
        deadline = time.monotonic() + 60
        while killed is None and time.monotonic() < deadline:
            pid = closing_pid()
            if pid is not None and any(p.pid == pid for p in workers.processes):
                os.kill(pid, signal.SIGKILL)
                killed = pid
            time.sleep(0.005)
        # The next window of one identity opens while the others close: it goes at once.
        late = digest_create(client, "late", "u0@example.com")
        wait_until(all_final, timeout_s=120, what="every notification final")
        # Thousands of DIGESTED events: given longer than the check's own wait to arrive.
        reported = Notification.objects.exclude(status=Status.CANCELLED).count()
        wait_until(
            lambda: len(webhook_reports(webhooks)) >= reported,
            timeout_s=240,
            what="the webhook events",
        )
        counts = universal_check(provider, workers, webhooks=webhooks)

    buckets = list(NotificationDigest.objects.all())
    # The three filled ones, and the late window's (nothing joined it: it closed empty).
    assert {b.state for b in buckets} == {DigestState.CLOSED}
    closed = [b for b in buckets if b.collected]
    assert len(closed) == BUCKETS and len(buckets) == BUCKETS + 1
    for bucket in closed:
        digest = Notification.objects.get(id=bucket.digest_id)
        assert digest.status == Status.SENT
        assert f"{digest.id}:email" in provider.sends
        carried = Notification.objects.filter(digest_id=digest.id, status=Status.DIGESTED)
        assert carried.count() == bucket.digested == ROWS
        assert digest.body.startswith(f"{ROWS} new:\n")
        assert digest.body.endswith(f"and {ROWS - 50} more")
    assert (
        Notification.objects.filter(digest_bucket_id__isnull=False)
        .exclude(status__in=[Status.DIGESTED, Status.CANCELLED])
        .count()
        == 0
    )
    assert counts[Status.DIGESTED] == BUCKETS * ROWS
    assert counts[Status.CANCELLED] == BUCKETS
    assert Notification.objects.get(id=late.id).status == Status.SENT
    assert killed is not None, "no worker was caught mid-close"
    assert database_now() - min(b.closes_at for b in buckets) < timedelta(minutes=5)
