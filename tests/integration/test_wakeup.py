"""Wake-ups only while a worker waits (delivery/sql/functions/notification_wakeup.sql).

A create notifies `notifyqueue_due` at its commit only while some worker's heartbeat row is
marked waiting; a worker marks it before it sleeps and claims once more, and the mark waits for
every create whose trigger has already looked. These tests listen on a connection of their own
and hold creates open on others, so the lost wake-up the mark must prevent is played out: a
create that saw no waiting worker, still uncommitted while a worker marks itself.
"""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from django.db import connection, connections, transaction

from delivery.models import WorkerHeartbeat
from delivery.repositories import SQL, DeliveryRepository
from delivery.wakeup import WAKEUP_CHANNEL
from tests.support.delivery_helpers import worker_build
from tests.support.factories import NotificationFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def listener(database_url):
    """A LISTEN connection; `heard()` says whether a wake-up arrived since the last call."""
    conn = psycopg.connect(database_url, autocommit=True)
    conn.execute(f"LISTEN {WAKEUP_CHANNEL}")

    def heard(within_s: float = 0.3) -> bool:
        return any(True for _ in conn.notifies(timeout=within_s, stop_after=1))

    yield heard
    conn.close()


def waiting_worker(worker_id: str = "w-1") -> DeliveryRepository:
    repository = DeliveryRepository()
    repository.worker_heartbeat(worker=worker_id, hostname="h", pid=1, delivered=0)
    repository.worker_waiting_mark(worker=worker_id)
    return repository


def test_a_create_notifies_only_while_a_worker_waits(listener):
    NotificationFactory()
    assert not listener()  # no worker waits: nobody to wake, no NOTIFY
    repository = waiting_worker()
    NotificationFactory()
    assert listener()
    repository.worker_waiting_clear(worker="w-1")
    NotificationFactory()
    assert not listener()


def test_a_stopped_worker_asks_for_no_wake_up(listener):
    waiting_worker().worker_stopped(worker="w-1", delivered=0)
    assert not WorkerHeartbeat.objects.get(worker_id="w-1").waiting
    NotificationFactory()
    assert not listener()


def test_a_dead_workers_mark_is_cleared_at_a_live_workers_heartbeat(listener):
    """A worker killed outright cannot clear its mark; the creates would notify for it for
    ever. A live worker's heartbeat clears the marks of workers not seen for three of its
    heartbeats (at least a minute), and restates its own."""
    waiting_worker("dead")
    with connection.cursor() as cursor:  # five minutes ago by the database's clock
        cursor.execute(
            "UPDATE worker_heartbeat SET last_seen_at = notifyqueue_now() - interval '5 minutes' "
            "WHERE worker_id = 'dead'"
        )
    alive = worker_build()
    assert alive.heartbeat.run_once(delivered=0, waiting=False) == 1  # the dead one's
    assert not WorkerHeartbeat.objects.get(worker_id="dead").waiting
    NotificationFactory()
    assert not listener()

    alive._waiting_mark()
    WorkerHeartbeat.objects.filter(worker_id=alive.worker_id).update(waiting=False)
    # Taken for dead while stalled: its next beat finds the mark gone, and the loop's next
    # turn marks it again.
    alive.heartbeat.run_once(delivered=0, waiting=alive._waiting)
    assert alive.heartbeat.mark_lost.is_set()
    alive._maintain(time.monotonic())
    assert WorkerHeartbeat.objects.get(worker_id=alive.worker_id).waiting
    NotificationFactory()
    assert listener()
    alive.stop()
    alive.run(until_empty=True)
    connections.close_all()


def test_a_mark_waits_for_a_create_that_looked_before_it_and_the_next_claim_sees_it(listener):
    """The race a plain flag would lose: the create's trigger finds no worker waiting, the
    worker marks itself and claims before the create commits, and sleeps; the row waits for
    the next poll. The mark's lock makes the worker wait for that commit instead."""
    repository = DeliveryRepository()
    repository.worker_heartbeat(worker="w-1", hostname="h", pid=1, delivered=0)
    inserted, release = threading.Event(), threading.Event()
    created = []

    def create_and_hold() -> None:
        try:
            with transaction.atomic():
                created.append(NotificationFactory())  # its trigger has run: no one waits
                inserted.set()
                release.wait(10)
        finally:
            connection.close()

    def mark() -> None:
        try:
            repository.worker_waiting_mark(worker="w-1")
        finally:
            connection.close()

    creating = threading.Thread(target=create_and_hold)
    creating.start()
    assert inserted.wait(10)
    marking = threading.Thread(target=mark)
    marking.start()
    marking.join(0.5)
    assert marking.is_alive()  # waits for the create in flight
    release.set()
    creating.join(10)
    marking.join(10)
    assert not marking.is_alive()
    assert not listener()  # that create sent no wake-up...
    claims = repository.notification_claim_due(worker="w-1", limit=10, claim_timeout_s=30)
    assert [claim.id for claim in claims] == [created[0].id]  # ...and the claim finds it


def test_a_row_committed_while_a_worker_goes_to_sleep_is_sent_without_a_wake_up(database_url):
    """The worker's side of the race above: a create has found no worker waiting and is not
    yet committed while a running worker finds nothing due and marks itself. The mark waits
    for that commit, and the worker looks once more before it sleeps: the row is sent long
    before the 10 s poll, though it sent no NOTIFY."""
    from delivery.services import RetryPolicy
    from delivery.worker import Worker, WorkerConfig
    from notifications.models import Notification, Status
    from tests.support.delivery_helpers import simulated_providers

    worker = Worker(
        providers=simulated_providers(),
        config=WorkerConfig(concurrency=2, batch_size=10, poll_interval_s=10, heartbeat_s=30),
        policy=RetryPolicy(base_s=0.5, max_s=60),
    )
    inserted, release = threading.Event(), threading.Event()
    created = []

    def create_and_hold() -> None:
        try:
            with transaction.atomic():
                created.append(NotificationFactory())
                inserted.set()
                release.wait(10)
        finally:
            connection.close()

    creating = threading.Thread(target=create_and_hold)
    creating.start()
    assert inserted.wait(10)
    running = threading.Thread(target=lambda: (worker.run(), connections.close_all()))
    running.start()
    try:
        with psycopg.connect(database_url, autocommit=True) as watcher:
            deadline = time.monotonic() + 10
            while not watcher.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            ).fetchone()[0]:
                assert time.monotonic() < deadline, "the worker never waited to mark itself"
                time.sleep(0.02)
        release.set()  # the create commits: no worker was marked when its trigger ran
        creating.join(10)
        deadline = time.monotonic() + 5
        while Notification.objects.get(id=created[0].id).status != Status.SENT:
            assert time.monotonic() < deadline, "the row waited for the poll"
            time.sleep(0.02)
    finally:
        release.set()
        worker.stop()
        running.join(15)


def test_an_idle_worker_marks_itself_and_a_busy_one_clears_its_mark():
    worker = worker_build(concurrency=2, batch_size=2)
    try:
        worker._loop_once(until_empty=False)  # nothing due: marks itself, then claims again
        assert WorkerHeartbeat.objects.get(worker_id=worker.worker_id).waiting
        NotificationFactory.create_batch(6)
        worker._loop_once(until_empty=False)  # a full claim
        assert not WorkerHeartbeat.objects.get(worker_id=worker.worker_id).waiting
    finally:
        worker.stop()
        worker.run(until_empty=True)
    connections.close_all()


def test_a_create_while_every_worker_is_busy_costs_no_wake_up_and_is_still_delivered(listener):
    worker = worker_build(concurrency=2, batch_size=2)
    NotificationFactory.create_batch(4)
    worker._loop_once(until_empty=False)  # full: busy, not marked
    started = time.monotonic()
    late = NotificationFactory()
    assert not listener()
    worker.run(until_empty=True)
    late.refresh_from_db()
    assert late.status == "SENT"
    assert time.monotonic() - started < 10


class StatementsSeen:
    """The statements a worker sends, in order (`sent`), as a connection execute wrapper; while
    `wake_during_claim`, each claim is followed by a create's NOTIFY, arriving while the turn
    runs."""

    def __init__(self, worker) -> None:
        self.worker = worker
        self.sent: list[str] = []
        self.wake_during_claim = True

    def __call__(self, execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        self.sent.append(sql)
        if sql == SQL["notification_claim_due"] and self.wake_during_claim:
            self.worker._notify()
        return result


def test_a_wake_up_during_a_dry_turn_has_the_next_turn_claim_without_asking_for_the_next_due_time():
    """At a steady rate of creates most dry turns end with a NOTIFY already in: the next turn
    claims at once, so the statement for the next row's due time would go unused. Without a
    NOTIFY, a dry turn still asks it (the wait until a scheduled row is due)."""
    worker = worker_build(concurrency=2, batch_size=2)
    claim, next_due = SQL["notification_claim_due"], SQL["notification_next_due_in"]
    seen = StatementsSeen(worker)

    try:
        worker._loop_once(until_empty=False)  # nothing due: marks itself
        with connection.execute_wrapper(seen):
            worker._loop_once(until_empty=False)  # a dry claim, a NOTIFY meanwhile
            assert seen.sent.count(claim) == 1
            assert next_due not in seen.sent
            seen.wake_during_claim = False
            seen.sent.clear()
            worker._loop_once(until_empty=False)  # claims at once: dry, no NOTIFY
            assert seen.sent.count(claim) == 1
            assert seen.sent.count(next_due) == 1
    finally:
        worker.stop()
        worker.run(until_empty=True)
    connections.close_all()


def test_a_wake_up_during_a_turn_has_the_next_claim_go_before_the_turns_results():
    """A NOTIFY that arrives while a turn runs means a row waits to be claimed: the turn's
    results wait for the next turn, which claims first and then records them with its own.
    Without a NOTIFY a turn records its results at once."""
    worker = worker_build(concurrency=2, batch_size=2)
    claim, finish = SQL["notification_claim_due"], SQL["notification_finish"]
    seen = StatementsSeen(worker)

    try:
        worker._loop_once(until_empty=False)  # nothing due: marks itself
        first = NotificationFactory()
        with connection.execute_wrapper(seen):
            worker._loop_once(until_empty=False)  # claims and sends `first`; a NOTIFY meanwhile
            assert seen.sent.count(claim) == 1
            assert finish not in seen.sent
            first.refresh_from_db()
            assert first.status == "PROCESSING"
            second = NotificationFactory()
            seen.wake_during_claim = False
            seen.sent.clear()
            worker._loop_once(until_empty=False)  # claims `second`, then records both
            assert [s for s in seen.sent if s in (claim, finish)] == [claim, finish]
        first.refresh_from_db()
        second.refresh_from_db()
        assert (first.status, second.status) == ("SENT", "SENT")
    finally:
        worker.stop()
        worker.run(until_empty=True)
    connections.close_all()


def test_results_wait_for_wake_ups_no_longer_than_record_wait_s():
    """Creates arriving faster than the turns never keep a result unrecorded past
    RECORD_WAIT_S: the first turn after it records, wake-up or not."""
    from delivery.worker import RECORD_WAIT_S

    worker = worker_build(concurrency=2, batch_size=2)
    claim, finish = SQL["notification_claim_due"], SQL["notification_finish"]
    sent: list[str] = []

    def watch(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        sent.append(sql)
        if sql == claim:
            worker._notify()  # a NOTIFY during every turn
        return result

    try:
        worker._loop_once(until_empty=False)  # nothing due: marks itself
        first = NotificationFactory()
        with connection.execute_wrapper(watch):
            worker._loop_once(until_empty=False)
            assert finish not in sent
            time.sleep(RECORD_WAIT_S)
            worker._loop_once(until_empty=False)
            assert sent.count(finish) == 1
        first.refresh_from_db()
        assert first.status == "SENT"
    finally:
        worker.stop()
        worker.run(until_empty=True)
    connections.close_all()
