"""Rescue by liveness on real PostgreSQL: a worker whose heartbeat is older than
NOTIFYQUEUE_WORKER_DEAD_AFTER_SECONDS (by the database's clock) loses its notification and
webhook claims at the next takeover, a live one keeps them however slow its loop, a claim past
its timeout is taken whoever holds it, the loser's late results change nothing, and the
takeover's cost does not grow with the backlog. The same with real `run_worker` processes,
SIGKILL, SIGSTOP and terminated sessions: tests/faults/test_liveness.py."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections, transaction
from prometheus_client import REGISTRY

from delivery.models import DeliveryAttempt, Outcome
from delivery.providers.base import Accepted, Message
from delivery.repositories import SQL, DeliveryRepository, Finish
from delivery.services import RetryPolicy
from delivery.upkeep import ClaimReclaimer
from delivery.worker import Worker, WorkerConfig
from notifications.models import Notification, Status
from tests.support.factories import ClientFactory, NotificationFactory
from tests.support.operator_helpers import notifications_insert_bulk
from tests.support.webhook_factories import WebhookEventFactory
from webhooks import repositories as webhook_repositories
from webhooks.models import AttemptOutcome, DeliveryState, WebhookDeliveryAttempt, WebhookEvent
from webhooks.services import webhook_events_reclaim_expired

pytestmark = pytest.mark.django_db(transaction=True)

DEAD_AFTER_S = 30.0


def beat(worker: str, *, seen_ago_s: float = 0.0) -> None:
    """The worker's heartbeat row, last written `seen_ago_s` ago by the database's clock."""
    DeliveryRepository().worker_heartbeat(worker=worker, hostname="h", pid=1, delivered=0)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE worker_heartbeat "
            "SET last_seen_at = notifyqueue_now() - make_interval(secs => %s) "
            "WHERE worker_id = %s",
            [seen_ago_s, worker],
        )


def claims_of(worker: str, count: int):
    return DeliveryRepository().notification_claim_due(
        worker=worker, limit=count, claim_timeout_s=300
    )


def rescued(kind: str, cause: str) -> float:
    labels = {"kind": kind, "cause": cause}
    return REGISTRY.get_sample_value("notifyqueue_claims_rescued_total", labels) or 0.0


def test_a_dead_workers_claims_are_taken_over_and_a_live_ones_kept():
    NotificationFactory.create_batch(8, client=ClientFactory())
    dead, live, ghost = claims_of("dead", 3), claims_of("live", 3), claims_of("ghost", 2)
    beat("dead", seen_ago_s=DEAD_AFTER_S + 1)
    beat("live", seen_ago_s=DEAD_AFTER_S - 1)  # late, but not past the limit
    # "ghost" has no heartbeat row (a worker started without one): only its claim timeout
    # hands its claims over.
    repository = DeliveryRepository()
    assert repository.notification_reclaim_expired(dead_after_s=None) == []
    before = rescued("notification", "dead_worker")

    taken = ClaimReclaimer(repository=repository, worker_id="w", dead_after_s=DEAD_AFTER_S)
    assert taken.run_once() == 3

    assert rescued("notification", "dead_worker") == before + 3
    rows = {n.id: n for n in Notification.objects.all()}
    assert {c.id for c in dead} == {i for i, n in rows.items() if n.status == Status.PENDING}
    assert all(rows[c.id].status == Status.PROCESSING for c in live + ghost)
    assert {rows[c.id].last_error for c in dead} == {"claim taken over: worker dead is dead"}
    abandoned = DeliveryAttempt.objects.filter(outcome=Outcome.ABANDONED)
    assert sorted(abandoned.values_list("error", flat=True)) == ["worker dead"] * 3
    # Fencing: the dead worker's late results name claims it no longer holds.
    late = [Finish(c.id, c.claim_token, Status.SENT, Outcome.SENT) for c in dead]
    assert repository.notification_finish(late) == []
    assert not Notification.objects.filter(status=Status.SENT).exists()


def test_a_stopped_workers_leftover_claims_are_taken_at_once():
    NotificationFactory.create_batch(2)
    claims = claims_of("stopped", 2)
    beat("stopped")
    DeliveryRepository().worker_stopped(worker="stopped", delivered=0)
    taken = DeliveryRepository().notification_reclaim_expired(dead_after_s=DEAD_AFTER_S)
    assert sorted(r.id for r in taken) == sorted(c.id for c in claims)
    assert {r.cause for r in taken} == {"dead_worker"}


def test_a_claim_past_its_timeout_is_taken_whoever_holds_it():
    NotificationFactory.create_batch(2)
    repository = DeliveryRepository()
    (expired,) = repository.notification_claim_due(worker="live", limit=1, claim_timeout_s=-1)
    (kept,) = claims_of("live", 1)
    beat("live")
    before = rescued("notification", "claim_timeout")

    taken = ClaimReclaimer(repository=repository, worker_id="w", dead_after_s=DEAD_AFTER_S)
    assert taken.run_once() == 1

    assert rescued("notification", "claim_timeout") == before + 1
    assert Notification.objects.get(id=expired.id).status == Status.PENDING
    assert Notification.objects.get(id=kept.id).status == Status.PROCESSING


def test_a_dead_workers_webhook_claims_are_taken_over_and_a_live_ones_kept(settings):
    settings.NOTIFYQUEUE_WORKER_DEAD_AFTER_SECONDS = DEAD_AFTER_S
    for _ in range(2):
        WebhookEventFactory(client=ClientFactory(webhook_url="https://hooks.example.com/"))

    def claim(worker):
        return webhook_repositories.webhook_events_claim_due(
            limit=1, per_client=4, claim_timeout_s=300, worker=worker
        )

    (dead,), (live,) = claim("dead"), claim("live")
    beat("dead", seen_ago_s=DEAD_AFTER_S + 1)
    beat("live")
    before = rescued("webhook_event", "dead_worker")

    (taken,) = webhook_events_reclaim_expired()

    assert (taken.id, taken.state, taken.cause) == (dead.id, DeliveryState.PENDING, "dead_worker")
    assert rescued("webhook_event", "dead_worker") == before + 1
    assert WebhookEvent.objects.get(id=live.id).state == DeliveryState.DELIVERING
    attempt = WebhookDeliveryAttempt.objects.get(claim_token=dead.claim_token)
    assert attempt.outcome == AttemptOutcome.ABANDONED
    # Fencing: the dead sender's late result changes nothing.
    late = webhook_repositories.EventResult(
        event_id=dead.id,
        claim_token=dead.claim_token,
        state=DeliveryState.DELIVERED,
        outcome=AttemptOutcome.DELIVERED,
        retry_in_s=None,
        status_code=200,
        error=None,
        duration_ms=5,
    )
    assert webhook_repositories.webhook_events_finish([late]) == set()
    assert WebhookEvent.objects.get(id=dead.id).state == DeliveryState.PENDING


def _takeover_choice_buffers() -> int:
    """Shared buffers the takeover reads of the queue table to find the claims it takes (every
    scan of notification_queue and its indexes in its plan), measured with EXPLAIN ANALYZE and
    rolled back: three dead workers' 15 claims, the live workers' looked at. Taking the chosen
    rows costs the same per row whatever the backlog, and is left out."""

    class Rollback(Exception):
        pass

    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + SQL["notification_reclaim_expired"],
                SQL_PARAMS,
            )
            (plan,) = cursor.fetchone()[0]
            raise Rollback(plan)
    except Rollback as done:
        plan = done.args[0]["Plan"]

    def scans(node):
        if node.get("Relation Name") == "notification_queue":
            yield node
        for child in node.get("Plans", []):
            yield from scans(child)

    queue_scans = list(scans(plan))
    assert queue_scans, plan
    return sum(p["Shared Hit Blocks"] + p["Shared Read Blocks"] for p in queue_scans)


def test_the_takeover_reads_the_claims_by_worker_and_its_cost_does_not_grow_with_the_backlog():
    client = ClientFactory()
    for worker in ("dead-1", "dead-2", "dead-3", "live-1", "live-2"):
        NotificationFactory.create_batch(5, client=client)
        claims_of(worker, 5)
        beat(worker, seen_ago_s=DEAD_AFTER_S + 5 if worker.startswith("dead") else 0)
    notifications_insert_bulk(client_id=client.id, count=500, status="PENDING")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE notification_queue")
        cursor.execute("EXPLAIN " + SQL["notification_reclaim_expired"], SQL_PARAMS)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "queue_claimed_by" in plan, plan
    assert "Seq Scan on notification_queue" not in plan, plan
    small = _takeover_choice_buffers()

    notifications_insert_bulk(client_id=client.id, count=40_000, status="PENDING")
    notifications_insert_bulk(client_id=client.id, count=10_000, status="DEAD_LETTERED")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE notification_queue")
    large = _takeover_choice_buffers()

    print(f"takeover of 15 claims reads {small} buffers at 500 waiting rows, {large} at 50,500")
    # A hundred times the backlog: the indexes may grow a level deeper (a page more a probe);
    # reading the backlog would cost hundreds of pages more.
    assert large <= small + 30, (small, large)


SQL_PARAMS = {"dead_after_s": DEAD_AFTER_S, "limit": 1000}


class SlowBatch:
    """A batch provider (called on the worker's loop) that takes `hold_s` to answer: a loop
    step that long, as a slow statement or a large batch would make it."""

    name = "slow-batch"

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self.inside = threading.Event()
        self.calls: list[str] = []

    def send(self, message: Message):
        return self.send_batch([message])[0]

    def send_batch(self, messages: list[Message]):
        self.calls += [m.idempotency_key for m in messages]
        self.inside.set()
        time.sleep(self.hold_s)
        return [Accepted(f"id-{m.idempotency_key}") for m in messages]


def test_a_worker_whose_loop_is_stuck_longer_than_the_dead_after_keeps_its_claims():
    """The heartbeat beats from its own thread: a loop step three times the dead-after long
    does not make the worker look dead, and nobody takes its claim."""
    notification = NotificationFactory(channel="email")
    dead_after_s = 0.6
    provider = SlowBatch(hold_s=3 * dead_after_s)
    worker = Worker(
        providers={"email": provider},
        config=WorkerConfig(
            concurrency=2,
            batch_size=10,
            poll_interval_s=0.05,
            heartbeat_s=0.2,
            dead_after_s=dead_after_s,
        ),
        policy=RetryPolicy(base_s=0.5, max_s=60),
    )
    thread = threading.Thread(
        target=lambda: (worker.run(until_empty=True), connections.close_all())
    )
    thread.start()
    try:
        assert provider.inside.wait(10)
        time.sleep(2 * dead_after_s)  # the loop is still inside the provider
        assert DeliveryRepository().notification_reclaim_expired(dead_after_s=dead_after_s) == []
        with connection.cursor() as cursor:
            cursor.execute("SELECT worker_dead(%s, %s)", [worker.worker_id, dead_after_s])
            assert cursor.fetchone()[0] is False
    finally:
        thread.join(timeout=30)
    notification.refresh_from_db()
    assert notification.status == Status.SENT
    assert provider.calls == [f"{notification.id}:email"]
    assert not DeliveryAttempt.objects.filter(outcome=Outcome.ABANDONED).exists()
