"""The close of digest buckets on real PostgreSQL, the database clock moved by the test: one
digest per window, sent through the ordinary stages; each collected notification DIGESTED
exactly once or left out (cancelled, expired); several closers at once, a closer that stops
mid-close and another that takes over; a bucket of 100,000; the close's cost against history.
The API's side is in test_digests_api.py; real `run_worker` processes killed mid-close in
tests/faults/test_digests_faults.py."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.db import connection, transaction

from notifications import services
from notifications.digests import DIGEST_ITEMS_SHOWN, DigestCloser
from notifications.models import DigestState, Notification, NotificationDigest, Status
from notifications.services import NotificationRequest
from notifyqueue.vocabulary import MAX_BODY_BYTES
from preferences.routing import NotificationContent
from ratelimits.services import RateLimit
from templates.services import template_put
from tests.support.clock import DbClock, database_now
from tests.support.delivery_helpers import step_until_idle, worker_build
from tests.support.factories import ClientFactory
from tests.support.queue_table import queue_differences
from tests.support.reads import pages_visited
from webhooks.models import WebhookEvent

pytestmark = pytest.mark.django_db(transaction=True)

EVENT = "comment"


@pytest.fixture
def clock():
    return DbClock(database_now() + timedelta(seconds=5))


@pytest.fixture
def client():
    client = ClientFactory(webhook_url="https://hooks.example.com/notify")
    for channel in ("email", "sms"):
        template_put(
            client_id=client.id,
            event=EVENT,
            channel=channel,
            subject="{who} commented" if channel == "email" else "",
            body="{digest_count} new on {post}:\n{digest_items}",
            now=database_now(),
        )
    return client


def create(client, key: str, *, who: str = "Bob", digest_key: str = "post-1", **fields):
    request = NotificationRequest(
        channel=fields.pop("channel", "email"),
        recipient=fields.pop("recipient", "ada@example.com"),
        template=EVENT,
        payload={"who": who, "post": "Post 1"},
        digest_key=digest_key,
        digest_window_seconds=fields.pop("window", 600),
        **fields,
    )
    return services.notification_create(
        client_id=client.id,
        idempotency_key=key,
        request=request,
        renderer=NotificationContent(),
        max_pending=10**9,
    ).notification


def run_until_empty() -> None:
    """A worker's whole loop (its upkeep first: expiry, the digests' close), until nothing is
    due or in flight."""
    worker_build().run(until_empty=True)


def closer(worker_id: str = "closer-1", **kwargs) -> DigestCloser:
    return DigestCloser(worker_id=worker_id, claim_s=30.0, dead_after_s=None, **kwargs)


def digest_check() -> dict[uuid.UUID, int]:
    """Every collected row is final (DIGESTED, CANCELLED or EXPIRED); each DIGESTED row names
    the digest of its own bucket, which exists once and counts exactly the rows naming it;
    every CLOSED bucket's digest count is its DIGESTED rows. Returns rows by digest."""
    rows = list(
        Notification.objects.filter(digest_bucket_id__isnull=False).values_list(
            "id", "status", "digest_bucket_id", "digest_id"
        )
    )
    buckets = {b.id: b for b in NotificationDigest.objects.all()}
    by_digest: dict[uuid.UUID, int] = {}
    for _, status, bucket_id, digest_id in rows:
        assert status in (Status.DIGESTED, Status.CANCELLED, Status.EXPIRED), status
        if status == Status.DIGESTED:
            assert digest_id == buckets[bucket_id].digest_id
            by_digest[digest_id] = by_digest.get(digest_id, 0) + 1
        else:
            assert digest_id is None
    for bucket in buckets.values():
        if bucket.state == DigestState.CLOSED and bucket.digest_id is not None:
            digest = Notification.objects.get(id=bucket.digest_id)
            assert digest.idempotency_key == f"digest:{bucket.id}"
            assert digest.metadata["digest_count"] == by_digest[bucket.digest_id]
            assert bucket.digested == by_digest[bucket.digest_id]
    assert not queue_differences()
    return by_digest


def test_a_window_closes_into_one_digest_sent_through_the_stages(clock, client):
    first = create(client, "k-0", who="Ann")
    clock.advance(1)
    held = [create(client, f"k-{i}", who=name) for i, name in enumerate(["Bob", "Cy", "Di"], 1)]
    assert all(n.held_reason == "digest" for n in held)
    run_until_empty()
    # Only the first went; the window is still open.
    assert Notification.objects.get(id=first.id).status == Status.SENT
    assert set(
        Notification.objects.filter(id__in=[n.id for n in held]).values_list("status", flat=True)
    ) == {Status.PENDING}
    clock.advance(600)
    run_until_empty()
    bucket = NotificationDigest.objects.get()
    assert bucket.state == DigestState.CLOSED and bucket.digested == 3
    digest = Notification.objects.get(id=bucket.digest_id)
    assert digest.status == Status.SENT
    assert digest.subject == "Di commented"  # the newest item's payload fills the rest
    assert digest.body == "3 new on Post 1:\nBob commented\nCy commented\nDi commented"
    assert digest.payload["digest_count"] == 3
    for row in Notification.objects.filter(id__in=[n.id for n in held]):
        assert (row.status, row.digest_id) == (Status.DIGESTED, digest.id)
    # Each collected notification's webhook says so; the digest's says SENT.
    reported = dict(WebhookEvent.objects.values_list("notification_id", "status"))
    assert all(reported[n.id] == Status.DIGESTED for n in held)
    assert reported[digest.id] == Status.SENT
    assert digest_check() == {digest.id: 3}


def test_cancelled_and_expired_before_the_close_are_left_out(clock, client):
    create(client, "open")
    kept = create(client, "kept", who="Kept")
    by_id = create(client, "by-id", who="One")
    by_key = [create(client, f"ck-{i}", who="Grouped", cancellation_key="grp") for i in range(3)]
    expiring = create(client, "exp", who="Late", ttl_seconds=60)
    services.notification_cancel(notification_id=by_id.id, client_id=client.id, now=clock.now)
    assert services.notifications_cancel_by_key(client_id=client.id, cancellation_key="grp") == 3
    clock.advance(600)
    # The expiry upkeep has not run: the close leaves the expired row waiting, and the upkeep
    # then ends it EXPIRED.
    assert closer().run_once() == 1
    bucket = NotificationDigest.objects.get()
    assert bucket.digested == 1
    assert Notification.objects.get(id=kept.id).status == Status.DIGESTED
    assert Notification.objects.get(id=by_id.id).status == Status.CANCELLED
    assert {n.status for n in Notification.objects.filter(id__in=[n.id for n in by_key])} == {
        Status.CANCELLED
    }
    digest = Notification.objects.get(id=bucket.digest_id)
    assert digest.body == "1 new on Post 1:\nKept commented"
    run_until_empty()
    assert Notification.objects.get(id=expiring.id).status == Status.EXPIRED
    digest_check()


def test_a_bucket_whose_rows_were_all_cancelled_closes_without_a_digest(clock, client):
    create(client, "open")
    gone = create(client, "gone")
    services.notification_cancel(notification_id=gone.id, client_id=client.id, now=clock.now)
    clock.advance(601)
    assert closer().run_once() == 1
    bucket = NotificationDigest.objects.get()
    assert (bucket.state, bucket.digest_id, bucket.digested) == (DigestState.CLOSED, None, 0)
    assert Notification.objects.count() == 2


def test_a_cancel_after_the_close_took_the_row_is_refused(clock, client):
    create(client, "open")
    row = create(client, "row")
    clock.advance(601)
    closer().run_once()
    with pytest.raises(services.NotificationNotCancellable):
        services.notification_cancel(notification_id=row.id, client_id=client.id, now=clock.now)
    assert services.notifications_cancel_by_key(client_id=client.id, cancellation_key="x") == 0


def test_several_closers_at_once_close_every_bucket_once(clock, client):
    for b in range(12):
        for i in range(25):
            create(client, f"b{b}-{i}", digest_key=f"key-{b}")
    clock.advance(601)
    barrier = threading.Barrier(4)
    closed: list[int] = []

    def run(name: str) -> None:
        try:
            one = closer(name, batch=7, rows_per_turn=14)
            barrier.wait()
            total = 0
            for _ in range(200):
                total += one.run_once()
                if not one.due:
                    break
            closed.append(total)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(f"c{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sum(closed) == 12
    by_digest = digest_check()
    assert len(by_digest) == 12 and set(by_digest.values()) == {24}
    assert Notification.objects.filter(idempotency_key__startswith="digest:").count() == 12


def test_a_closer_that_stops_mid_close_leaves_the_bucket_to_another(clock, client):
    create(client, "open")
    rows = [create(client, f"r-{i}") for i in range(30)]
    clock.advance(601)
    stalled = closer("stalled", batch=10, rows_per_turn=10)
    assert stalled.run_once() == 0 and stalled.due  # a third judged, then it stops
    assert Notification.objects.filter(status=Status.DIGESTED).count() == 10
    bucket = NotificationDigest.objects.get()
    digest_id = bucket.digest_id
    # Another cannot take it while the claim holds...
    assert closer("other").run_once() == 0
    # ...and takes it once it expired, goes on where the first stopped, with the same digest.
    clock.advance(31)
    assert closer("other").run_once() == 1
    bucket.refresh_from_db()
    assert (bucket.state, bucket.digest_id, bucket.claimed_by) == (
        DigestState.CLOSED,
        digest_id,
        "other",
    )
    # The first comes back: its claim is gone, it writes nothing.
    assert stalled.run_once() == 0
    assert Notification.objects.filter(id=digest_id).count() == 1
    assert digest_check() == {digest_id: len(rows)}


def test_a_dead_workers_close_is_taken_over_before_its_claim_expires(clock, client):
    create(client, "open")
    for i in range(5):
        create(client, f"r-{i}")
    clock.advance(601)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO worker_heartbeat (worker_id, hostname, pid, started_at, last_seen_at,"
            " delivered) VALUES ('gone', 'h', 1, %(now)s, %(now)s, 0)",
            {"now": clock.now},
        )
    gone = closer("gone", batch=2, rows_per_turn=2)
    gone.run_once()
    clock.advance(31 - 25)  # well inside the 30 s claim, past the 5 s liveness
    rescuer = DigestCloser(worker_id="rescuer", claim_s=30.0, dead_after_s=5.0)
    assert rescuer.run_once() == 1
    assert NotificationDigest.objects.get().claimed_by == "rescuer"
    digest_check()


def test_a_rate_limit_deferral_leaves_collected_rows_waiting_for_their_close(clock, client):
    create(client, "open", recipient="rl@example.com")
    waiting = [create(client, f"w-{i}", recipient="rl@example.com") for i in range(5)]
    # Plain notifications to the same recipient, more than its limit.
    for i in range(4):
        services.notification_create(
            client_id=client.id,
            idempotency_key=f"plain-{i}",
            request=NotificationRequest(
                channel="email", recipient="rl@example.com", subject="s", body="b"
            ),
            max_pending=10**9,
        )
    worker = worker_build(rate_limit=RateLimit(limit=2, window_s=3600))
    step_until_idle(worker)
    worker.stop()
    worker._shutdown()
    for row in Notification.objects.filter(id__in=[n.id for n in waiting]):
        assert (row.status, row.rate_deferred_from) == (Status.PENDING, None)
        assert row.digest_bucket_id is not None
    deferred = Notification.objects.filter(rate_deferred_from__isnull=False)
    assert deferred.exists()
    assert not deferred.filter(digest_bucket_id__isnull=False).exists()


def test_a_bucket_of_100000_closes_as_one_bounded_digest_without_holding_others(clock, client):
    opener = create(client, "open", window=60)
    bucket = NotificationDigest.objects.get()
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO notification (
                id, client_id, idempotency_key, request_fingerprint, channel, recipient,
                subject, body, priority, metadata, fallback_channels, template, payload,
                status, send_at, due_at, attempt_count, max_attempts, operator_retries,
                created_at, updated_at, digest_bucket_id, digest_closes_at)
            SELECT notifyqueue_uuid7(), %(client)s, 'bulk-' || g, 'f', 'email',
                   'ada@example.com', 'Item ' || g || ' of many', 'b', 2, '{}', '[]', 'comment',
                   '{"who": "W", "post": "P"}', 'PENDING', %(now)s,
                   '9999-01-01T00:00:00Z', 0, 6, 0, %(now)s, %(now)s, %(bucket)s, %(closes)s
              FROM generate_series(1, 100000) AS g
            """,
            {
                "client": client.id,
                "now": clock.now,
                "bucket": bucket.id,
                "closes": bucket.closes_at,
            },
        )
        cursor.execute("ANALYZE notification")
    clock.advance(61)
    one = closer(batch=1000, rows_per_turn=5000)
    # A neighbour's create while the close runs goes through at once: the close holds at most
    # one batch's rows, and nothing of the neighbour's.
    stop = threading.Event()
    waits: list[float] = []

    def neighbour() -> None:
        try:
            i = 0
            while not stop.is_set():
                started = time.monotonic()
                create(client, f"n-{i}", digest_key="other", recipient="bo@example.com")
                waits.append(time.monotonic() - started)
                i += 1
                time.sleep(0.05)
        finally:
            connection.close()

    thread = threading.Thread(target=neighbour)
    thread.start()
    turns = 0
    started = time.monotonic()
    try:
        while True:
            turns += 1
            turn_started = time.monotonic()
            closed = one.run_once()
            assert time.monotonic() - turn_started < 10
            if closed:
                break
            assert one.due and turns < 100
    finally:
        stop.set()
        thread.join(30)
    took = time.monotonic() - started
    assert turns >= 100_000 // 5000  # bounded work a turn
    assert waits and max(waits) < 2.0, (max(waits), took)
    bucket.refresh_from_db()
    assert (bucket.state, bucket.digested) == (DigestState.CLOSED, 100_000)
    digest = Notification.objects.get(id=bucket.digest_id)
    assert len(digest.body.encode()) <= MAX_BODY_BYTES
    lines = digest.body.split("\n")
    assert lines[0] == "100000 new on P:"
    shown = lines[1:-1]
    assert len(shown) == len(set(shown)) == DIGEST_ITEMS_SHOWN
    assert all(line.startswith("Item ") and line.endswith(" of many") for line in shown)
    assert lines[-1] == f"and {100_000 - DIGEST_ITEMS_SHOWN} more"
    assert Notification.objects.filter(status=Status.DIGESTED).count() == 100_000
    assert Notification.objects.get(id=opener.id).status == Status.PENDING  # never collected


def test_the_close_reads_the_due_buckets_not_the_closed_history(clock, client):
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO notification_digest (
                id, client_id, identity, digest_key, channel, recipient, template, opened_by,
                opened_at, closes_at, collected, state, digested, closed_at)
            SELECT gen_random_uuid(), %(client)s, gen_random_uuid(), 'k' || g, 'email',
                   'a@example.com', 'comment', gen_random_uuid(), %(old)s, %(old)s, 3,
                   'CLOSED', 3, %(old)s
              FROM generate_series(1, 20000) AS g
            """,
            {"client": client.id, "old": clock.now - timedelta(days=3)},
        )
        cursor.execute("ANALYZE notification_digest")
    create(client, "open")
    create(client, "held")
    clock.advance(601)
    with transaction.atomic():
        before = pages_visited(("notification_digest",))
        claimed = closer().repository.claim(worker="w", limit=1, claim_s=30, dead_after_s=5.0)
        pages = pages_visited(("notification_digest",)) - before
    assert len(claimed) == 1
    assert pages < 30, pages
    with connection.cursor() as cursor:
        cursor.execute(
            "EXPLAIN SELECT d.id FROM notification_digest AS d WHERE d.state = 'OPEN'"
            " AND d.closes_at <= now() ORDER BY d.closes_at LIMIT 1 FOR UPDATE SKIP LOCKED"
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "notification_digest_due" in plan, plan
