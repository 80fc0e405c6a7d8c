"""Expiry and cancellation by key in delivery: in-process workers on real PostgreSQL, the
database clock moved by the test, real HTTP providers on loopback where a send must be held in
flight. The API's side is in test_expiry_api.py; real `run_worker` processes under faults in
tests/faults/test_expiry_and_cancellation.py."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction

from delivery.models import DeliveryAttempt, Outcome, SimulatedProviderMessage
from delivery.providers.http import HttpProvider
from delivery.repositories import DeliveryRepository
from delivery.services import RetryPolicy
from notifications import services
from notifications.models import Notification, Status
from notifications.repositories import NotificationRepository
from ratelimits.services import RateLimit
from tests.support.clock import DbClock, database_now
from tests.support.delivery_helpers import worker_build
from tests.support.factories import ClientFactory, NotificationFactory
from tests.support.http_servers import LoopbackProvider
from tests.support.queue_table import queue_differences
from tests.support.reads import pages_visited, table_reads, table_reads_since
from webhooks.models import WebhookEvent

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def clock():
    # A little ahead of this process's clock, which stamps the factory's rows: they are due.
    return DbClock(database_now() + timedelta(seconds=5))


@pytest.fixture
def close_workers():
    workers = []
    yield workers.append
    for worker in workers:
        worker.stop()
        worker._shutdown()


@pytest.fixture
def loopback():
    provider = LoopbackProvider()
    url = provider.start()
    yield provider, url
    provider.stop()


def wait_for(predicate, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def simulated_calls() -> int:
    return SimulatedProviderMessage.objects.count()


def settle(worker, *, steps: int = 50) -> None:
    """Steps the worker at the clock's current time until nothing is in flight or due."""
    for _ in range(steps):
        step = worker.run_once(wait_s=0.5)
        if not (step.claimed or step.finished or step.in_flight):
            return
    raise AssertionError("worker never went idle")


def http_worker(url: str, **kwargs):
    provider = HttpProvider(url=url, timeout_s=10)
    return worker_build(providers={"email": provider}, **kwargs)


# --- expiry ---------------------------------------------------------------------------------


def test_a_scheduled_notification_not_sent_by_its_expiry_ends_expired_with_its_webhook(
    clock, close_workers
):
    client = ClientFactory(webhook_url="https://hooks.example.com/n")
    due = clock.now + timedelta(seconds=60)
    waiting = NotificationFactory(
        client=client, send_at=due, due_at=due, expires_at=due + timedelta(seconds=30)
    )
    kept = NotificationFactory(client=client, send_at=due, due_at=due)
    worker = worker_build()
    close_workers(worker)
    clock.advance(200)  # no worker ran meanwhile: both are overdue, one past its expiry
    assert worker.expiry.run_once() == 1
    settle(worker)

    waiting.refresh_from_db()
    assert waiting.status == Status.EXPIRED
    assert waiting.last_error.startswith("expired: not sent by ")
    assert waiting.attempt_count == 0 and waiting.updated_at == clock.now
    assert Notification.objects.get(id=kept.id).status == Status.SENT
    assert simulated_calls() == 1  # the provider was asked only about the other
    event = WebhookEvent.objects.get(notification_id=waiting.id)
    assert (event.status, event.attempt_count) == ("EXPIRED", 0)
    assert queue_differences() == []


def test_a_claim_already_past_its_expiry_ends_in_the_expiry_stage_unsent(clock, close_workers):
    # Claimed before any upkeep ran: the claim answers the seconds left by the database clock,
    # and the stage ends it.
    row = NotificationFactory(expires_at=clock.now + timedelta(seconds=5))
    clock.advance(10)
    worker = worker_build()
    close_workers(worker)
    step = worker.run_once()
    assert step.claimed == 1
    row.refresh_from_db()
    assert (row.status, row.attempt_count) == (Status.EXPIRED, 0)
    attempt = DeliveryAttempt.objects.get(notification_id=row.id)
    assert attempt.outcome == Outcome.EXPIRED and attempt.finished_at == clock.now
    assert simulated_calls() == 0


def test_expiry_ends_a_row_waiting_out_a_retry_backoff(clock, close_workers):
    row = NotificationFactory(
        recipient="temporary-failure@example.com", expires_at=clock.now + timedelta(seconds=20)
    )
    worker = worker_build(policy=RetryPolicy(base_s=30, max_s=60))
    close_workers(worker)
    worker.run_once()
    row.refresh_from_db()
    assert (row.status, row.attempt_count) == (Status.PENDING, 1)
    assert row.due_at >= clock.now + timedelta(seconds=30)  # waits past its expiry
    clock.advance(19)
    assert worker.expiry.run_once() == 0
    clock.advance(2)
    assert worker.expiry.run_once() == 1
    row.refresh_from_db()
    assert (row.status, row.attempt_count) == (Status.EXPIRED, 1)
    clock.advance(60)
    settle(worker)
    assert SimulatedProviderMessage.objects.get().calls == 1  # no call after its expiry


def test_expiry_ends_a_row_a_rate_limit_holds_and_one_held_for_any_reason(clock, close_workers):
    client = ClientFactory()
    first = NotificationFactory(client=client, recipient="ada@example.com")
    worker = worker_build(rate_limit=RateLimit(1, 3600))
    close_workers(worker)
    settle(worker)
    held = NotificationFactory(
        client=client, recipient="ada@example.com", expires_at=clock.now + timedelta(seconds=50)
    )
    settle(worker)  # the recipient's one slot is taken: deferred to the next free one
    held.refresh_from_db()
    assert held.status == Status.PENDING and held.rate_deferred_from is not None
    # Any other hold (an open circuit's here, quiet hours or a digest alike): a PENDING row
    # with an expiry ends EXPIRED whatever holds it.
    circuit_held = NotificationFactory(
        client=client,
        due_at=clock.now + timedelta(hours=1),
        circuit_held_since=clock.now,
        expires_at=clock.now + timedelta(seconds=50),
    )
    clock.advance(51)
    assert worker.expiry.run_once() == 2
    for row in (held, circuit_held):
        row.refresh_from_db()
        assert row.status == Status.EXPIRED
        assert row.rate_deferred_from is None and row.circuit_held_since is None
    assert Notification.objects.get(id=first.id).status == Status.SENT
    assert queue_differences() == []


def test_the_upkeep_ends_expired_rows_in_bounded_batches(clock, close_workers):
    client = ClientFactory()
    expires = clock.now + timedelta(seconds=5)
    NotificationFactory.create_batch(7, client=client, expires_at=expires)
    worker = worker_build()
    worker.expiry.batch = 3
    close_workers(worker)
    clock.advance(6)
    assert [worker.expiry.run_once() for _ in range(4)] == [3, 3, 1, 0]
    assert Notification.objects.filter(status=Status.EXPIRED).count() == 7


def test_the_upkeeps_expiry_reads_the_expired_rows_not_the_backlog(clock):
    """A large backlog of rows that never expire, and more with a far expiry: ending the few
    past theirs reads a few pages of queue_pending_expiry, not the queue."""
    client = ClientFactory()
    now = clock.now
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO notification (id, client_id, idempotency_key, request_fingerprint,
                channel, recipient, subject, body, priority, metadata, fallback_channels,
                status, send_at, due_at, attempt_count, max_attempts, operator_retries,
                created_at, updated_at, expires_at)
            SELECT gen_random_uuid(), %(client)s, 'k' || g, 'f', 'email',
                   'u' || g || '@example.com', 's', 'b', 2, '{}', '[]', 'PENDING',
                   %(later)s, %(later)s, 0, 6, 0, %(now)s, %(now)s,
                   CASE WHEN g %% 4 = 0 THEN %(far)s END
              FROM generate_series(1, 20000) AS g
            """,
            {
                "client": client.id,
                "now": now,
                "later": now + timedelta(hours=1),
                "far": now + timedelta(days=7),
            },
        )
        cursor.execute("ANALYZE notification_queue")
    soon = [
        NotificationFactory(client=client, due_at=now + timedelta(hours=1), expires_at=now)
        for _ in range(5)
    ]
    clock.advance(1)
    repository = DeliveryRepository()
    with transaction.atomic():  # the counters are the transaction's
        before = table_reads("notification_queue")
        pages_before = pages_visited(("notification_queue",))
        expired = repository.notifications_expire(limit=1000)
        reads = table_reads_since("notification_queue", before)
        pages = pages_visited(("notification_queue",)) - pages_before
    assert {row.id for row in expired} == {row.id for row in soon}
    assert "notification_queue" not in reads, reads  # no sequential scan of the queue
    assert reads["queue_pending_expiry"][1] <= 6, reads
    # The index's few pages, the five rows' queue entries and the triggers' look-ups by key:
    # nothing of the backlog's.
    assert pages < 100, pages


# --- the last check before the provider ------------------------------------------------------


def test_expiry_reached_while_the_provider_holds_the_send_finishes_it_as_it_would_have(
    clock, close_workers, loopback
):
    provider, url = loopback
    provider.hold = True
    in_flight = NotificationFactory(expires_at=clock.now + timedelta(seconds=30))
    worker = http_worker(url, concurrency=1)
    close_workers(worker)
    worker.run_once()
    assert provider.received.wait(10)
    clock.advance(60)  # its expiry passes while the provider holds the call
    assert worker.expiry.run_once() == 0  # claimed and started: not the upkeep's
    provider.release.set()
    settle(worker)
    in_flight.refresh_from_db()
    assert in_flight.status == Status.SENT
    assert in_flight.send_started_at is None  # the finish clears the mark
    assert [call.key for call in provider.calls] == [f"{in_flight.id}:email"]


def test_a_claim_whose_expiry_passes_while_it_waits_for_a_send_thread_is_never_sent(
    clock, close_workers, loopback
):
    provider, url = loopback
    provider.hold = True
    # One client's rows, so the claim keeps their order (clients take turns otherwise).
    client = ClientFactory()
    first = NotificationFactory.create_batch(
        2, client=client, expires_at=clock.now + timedelta(seconds=300)
    )
    second = NotificationFactory(client=client, expires_at=clock.now + timedelta(seconds=30))
    # Two send threads: the third claim waits for one, its send not yet marked started.
    worker = http_worker(url, concurrency=2)
    close_workers(worker)
    assert worker.run_once().claimed == 3
    wait_for(lambda: len(provider.calls) == 2)
    second.refresh_from_db()
    assert second.status == Status.PROCESSING and second.send_started_at is None
    clock.advance(60)
    provider.release.set()
    settle(worker)
    second.refresh_from_db()
    assert (second.status, second.attempt_count) == (Status.EXPIRED, 0)
    assert {Notification.objects.get(id=row.id).status for row in first} == {Status.SENT}
    assert {call.key for call in provider.calls} == {f"{row.id}:email" for row in first}


def test_the_send_start_mark_answers_started_expired_or_nothing(clock):
    client = ClientFactory()
    rows = [NotificationFactory(client=client, expires_at=clock.now + timedelta(seconds=s))
            for s in (5, 50, 50)]  # fmt: skip
    repository = DeliveryRepository()
    claims = {c.id: c for c in repository.notification_claim_due(
        worker="w", limit=10, claim_timeout_s=300)}  # fmt: skip
    expiring, going, taken = (claims[row.id] for row in rows)
    Notification.objects.filter(id=taken.id).update(
        status=Status.CANCELLED, claim_token=None, claim_expires_at=None
    )
    clock.advance(10)
    states = repository.notification_send_start([expiring, going, taken])
    assert states == {expiring.id: "expired", going.id: "started"}
    assert Notification.objects.get(id=going.id).send_started_at == clock.now
    assert Notification.objects.get(id=expiring.id).send_started_at is None


# --- cancellation by key --------------------------------------------------------------------


def test_a_cancel_by_key_takes_waiting_and_claimed_unstarted_rows_not_started_or_others(
    clock, close_workers, loopback
):
    provider, url = loopback
    provider.hold = True
    acme, other = ClientFactory(), ClientFactory()
    started = NotificationFactory.create_batch(2, client=acme, cancellation_key="K")
    claimed = NotificationFactory(client=acme, cancellation_key="K")
    waiting = NotificationFactory(
        client=acme, cancellation_key="K", due_at=clock.now + timedelta(hours=1)
    )
    unkeyed = NotificationFactory(client=acme, due_at=clock.now + timedelta(seconds=1))
    theirs = NotificationFactory(
        client=other, cancellation_key="K", due_at=clock.now + timedelta(seconds=1)
    )
    worker = http_worker(url, concurrency=2, batch_size=3)
    close_workers(worker)
    # Claims three of acme's: two go to the send threads, the third waits for one (unmarked).
    assert worker.run_once().claimed == 3
    wait_for(lambda: len(provider.calls) == 2)
    claimed.refresh_from_db()
    assert claimed.status == Status.PROCESSING and claimed.attempt_count == 1

    cancelled = services.notifications_cancel_by_key(client_id=acme.id, cancellation_key="K")

    assert cancelled == 2
    claimed.refresh_from_db()
    assert (claimed.status, claimed.attempt_count, claimed.claim_token) == (
        Status.CANCELLED, 0, None,
    )  # fmt: skip
    attempt = DeliveryAttempt.objects.get(notification_id=claimed.id)
    assert attempt.outcome == Outcome.CANCELLED and attempt.finished_at is not None
    assert Notification.objects.get(id=waiting.id).status == Status.CANCELLED
    assert {Notification.objects.get(id=row.id).status for row in started} == {Status.PROCESSING}
    provider.release.set()
    clock.advance(2)
    settle(worker)
    # The sends already started finish as they would have.
    assert {Notification.objects.get(id=row.id).status for row in started} == {Status.SENT}
    assert Notification.objects.get(id=unkeyed.id).status == Status.SENT
    assert Notification.objects.get(id=theirs.id).status == Status.SENT
    sent_keys = {call.key for call in provider.calls}
    assert f"{claimed.id}:email" not in sent_keys and f"{waiting.id}:email" not in sent_keys
    assert queue_differences() == []
    # Repeating it is harmless.
    assert services.notifications_cancel_by_key(client_id=acme.id, cancellation_key="K") == 0


def test_a_cancel_by_key_frees_the_rate_limit_slot_of_a_claim_it_takes(clock, close_workers):
    client = ClientFactory()
    row = NotificationFactory(client=client, cancellation_key="K")
    repository = DeliveryRepository()
    [claim] = repository.notification_claim_due(worker="w", limit=1, claim_timeout_s=300)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO ratelimit_delivery (key, at, notification_id, claim_token)"
            " VALUES ('\\x00', notifyqueue_now(), %s, %s)",
            [row.id, claim.claim_token],
        )
    assert services.notifications_cancel_by_key(client_id=client.id, cancellation_key="K") == 1
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM ratelimit_delivery")
        assert cursor.fetchone()[0] == 0
    # The worker's later steps on it change nothing.
    assert repository.notification_send_start([claim]) == {}


def test_a_cancel_by_key_in_batches_cancels_every_row_and_reads_only_the_keys_entries(clock):
    client = ClientFactory()
    NotificationFactory.create_batch(25, client=client, cancellation_key="many")
    NotificationFactory.create_batch(5, client=client, cancellation_key="other")
    repository = NotificationRepository()
    with transaction.atomic():
        # Inside a transaction here only to read the counters (the API runs each batch alone).
        before = table_reads("notification_queue")
        cancelled = repository.cancel_by_key(client_id=client.id, cancellation_key="many", batch=4)
        reads = table_reads_since("notification_queue", before)
    assert cancelled == 25
    assert "notification_queue" not in reads, reads
    # The cancellable entries of the key, and the queue triggers' look-ups by primary key.
    assert set(reads) == {"queue_cancellable", "notification_queue_pkey"}, reads
    assert Notification.objects.filter(status=Status.CANCELLED).count() == 25
    assert Notification.objects.filter(cancellation_key="other", status=Status.PENDING).count() == 5


def test_a_cancel_by_key_waits_out_a_row_another_transaction_holds_then_cancels_it(clock):
    client = ClientFactory()
    rows = NotificationFactory.create_batch(3, client=client, cancellation_key="K")
    locked = threading.Event()
    release = threading.Event()

    def hold_one_row() -> None:
        with transaction.atomic():
            Notification.objects.select_for_update().get(id=rows[0].id)
            locked.set()
            release.wait(10)
        connection.close()

    holder = threading.Thread(target=hold_one_row)
    holder.start()
    assert locked.wait(10)
    threading.Timer(0.3, release.set).start()
    started = time.monotonic()
    cancelled = services.notifications_cancel_by_key(client_id=client.id, cancellation_key="K")
    holder.join(10)
    assert cancelled == 3
    assert time.monotonic() - started >= 0.25  # it waited for the held row, then took it
    assert Notification.objects.filter(status=Status.CANCELLED).count() == 3


def test_the_cancel_by_key_endpoint_answers_the_count_and_refuses_a_bad_key(api, acme, clock):
    client, _ = acme
    NotificationFactory.create_batch(3, client=client, cancellation_key="order-7")
    response = api.post(
        "/api/v1/notifications/cancel", {"cancellation_key": "order-7"}, format="json"
    )
    assert response.status_code == 200, response.json()
    assert response.json() == {"cancelled": 3}
    for bad in ("", "a\x00b", "k" * 256, None, [], "é"):
        refused = api.post("/api/v1/notifications/cancel", {"cancellation_key": bad}, format="json")
        assert refused.status_code == 400, (bad, refused.json())
        assert "cancellation_key" in refused.json()["error"]["fields"]
    unknown = api.post(
        "/api/v1/notifications/cancel", {"cancellation_key": "k", "extra": 1}, format="json"
    )
    assert unknown.status_code == 400
    missing = api.post("/api/v1/notifications/cancel", {}, format="json")
    assert missing.status_code == 400
    # The single cancel is as it was.
    row = NotificationFactory(client=client)
    single = api.post(f"/api/v1/notifications/{row.id}/cancel")
    assert single.status_code == 200 and single.json()["status"] == "CANCELLED"
