"""The worker end to end, in-process: real PostgreSQL, real threads, the simulated provider."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.db import connections, transaction
from django.utils import timezone

from delivery.models import DeliveryAttempt, Outcome, SimulatedProviderMessage
from delivery.repositories import DeliveryRepository
from delivery.services import RetryPolicy
from notifications.models import Channel, Notification, Status
from preferences.models import InboxMessage
from tests.support.delivery_helpers import FakeClock, simulated_providers, worker_build
from tests.support.factories import ClientFactory, NotificationFactory
from tests.support.races import run_in_threads
from webhooks.models import WebhookEvent

pytestmark = pytest.mark.django_db(transaction=True)


def drain(worker, clock: FakeClock, *, max_steps: int = 200) -> None:
    """Steps the worker, moving the clock to each next due time, until nothing is waiting."""
    repository = DeliveryRepository()
    for _ in range(max_steps):
        step = worker.run_once(wait_s=0.5)
        if step.claimed or step.finished or step.in_flight:
            continue
        due_in = repository.notification_next_due_in()
        if due_in is None:
            return
        clock.advance(max(0.0, due_in))
    raise AssertionError("worker did not drain the queue")


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def close_workers():
    workers = []
    yield workers.append
    for worker in workers:
        worker.stop()
        worker._shutdown()


def test_three_hundred_notifications_ten_workers_each_sent_exactly_once():
    client = ClientFactory()
    NotificationFactory.create_batch(300, client=client)
    workers = [worker_build(concurrency=2, batch_size=10) for _ in range(10)]

    def run(i, barrier):
        barrier.wait()
        workers[i].run(until_empty=True)

    run_in_threads(len(workers), run, timeout_s=60)

    assert Notification.objects.filter(status=Status.SENT).count() == 300
    store = SimulatedProviderMessage.objects.all()
    assert store.count() == 300
    assert {(m.calls, m.sends) for m in store} == {(1, 1)}  # 300 calls, 300 sends in all
    assert DeliveryAttempt.objects.filter(outcome=Outcome.SENT).count() == 300
    assert sum(w.delivered for w in workers) == 300
    assert len({a.worker for a in DeliveryAttempt.objects.all()}) > 1  # the work was shared


def test_always_temporary_failure_is_dead_lettered_after_six_attempts_with_backoff(
    clock, close_workers
):
    notification = NotificationFactory(recipient="temporary-failure@example.com")
    clock.now = timezone.now()
    worker = worker_build(policy=RetryPolicy(base_s=0.5, max_s=60))
    close_workers(worker)
    drain(worker, clock)

    notification.refresh_from_db()
    assert notification.status == Status.DEAD_LETTERED
    assert notification.attempt_count == 6
    assert "unavailable" in notification.last_error
    attempts = list(DeliveryAttempt.objects.filter(notification=notification).order_by("number"))
    assert [a.number for a in attempts] == [1, 2, 3, 4, 5, 6]
    assert {a.outcome for a in attempts} == {Outcome.TEMPORARY_FAILURE}
    for earlier, later in itertools.pairwise(attempts):
        wait_s = (later.started_at - earlier.finished_at).total_seconds()
        low = 0.5 * 2 ** (earlier.number - 1)
        assert low <= wait_s <= 2 * low, (earlier.number, wait_s)
    assert SimulatedProviderMessage.objects.get().calls == 6


def test_backoff_is_capped_at_the_maximum(clock, close_workers):
    notification = NotificationFactory(recipient="temporary-failure@example.com", max_attempts=9)
    clock.now = timezone.now()
    worker = worker_build(policy=RetryPolicy(base_s=0.5, max_s=5))
    close_workers(worker)
    drain(worker, clock)
    attempts = list(DeliveryAttempt.objects.filter(notification=notification).order_by("number"))
    waits = [
        (b.started_at - a.finished_at).total_seconds() for a, b in itertools.pairwise(attempts)
    ]
    assert len(waits) == 8
    assert max(waits) <= 5
    assert waits[-1] == 5  # 0.5 * 2^7 = 64 s, capped


def test_permanent_failure_fails_after_one_attempt(clock, close_workers):
    notification = NotificationFactory(recipient="permanent-failure@example.com")
    clock.now = timezone.now()
    worker = worker_build()
    close_workers(worker)
    drain(worker, clock)
    notification.refresh_from_db()
    assert (notification.status, notification.attempt_count) == (Status.FAILED, 1)
    assert "rejected" in notification.last_error


def test_flaky_two_is_sent_on_the_third_attempt(clock, close_workers):
    notification = NotificationFactory(recipient="flaky-2@example.com")
    clock.now = timezone.now()
    worker = worker_build()
    close_workers(worker)
    drain(worker, clock)
    notification.refresh_from_db()
    assert (notification.status, notification.attempt_count) == (Status.SENT, 3)
    assert notification.sent_at is not None
    outcomes = list(
        DeliveryAttempt.objects.filter(notification=notification)
        .order_by("number")
        .values_list("outcome", flat=True)
    )
    assert outcomes == [Outcome.TEMPORARY_FAILURE, Outcome.TEMPORARY_FAILURE, Outcome.SENT]
    sent = DeliveryAttempt.objects.get(notification=notification, outcome=Outcome.SENT)
    assert sent.provider_message_id.startswith("sim-")


def test_in_app_delivery_writes_the_inbox_row_with_sent(clock, close_workers):
    notification = NotificationFactory(channel=Channel.IN_APP, recipient="user-42", subject="Hi")
    clock.now = timezone.now()
    worker = worker_build()
    close_workers(worker)
    drain(worker, clock)
    notification.refresh_from_db()
    inbox = InboxMessage.objects.get(notification=notification)
    assert notification.status == Status.SENT
    assert (inbox.user_id, inbox.subject, inbox.body) == ("user-42", "Hi", notification.body)
    assert inbox.created_at == notification.sent_at


def test_final_statuses_write_their_webhook_event_in_the_same_transaction(clock, close_workers):
    client = ClientFactory(webhook_url="https://hooks.example.com/notify")
    silent = ClientFactory()  # no webhook URL: no events
    sent = NotificationFactory(client=client)
    failed = NotificationFactory(client=client, recipient="permanent-failure@example.com")
    dead = NotificationFactory(client=client, recipient="temporary-failure@x.com", max_attempts=2)
    NotificationFactory(client=silent)
    clock.now = timezone.now()
    worker = worker_build()
    close_workers(worker)
    drain(worker, clock)

    events = {e.notification_id: e for e in WebhookEvent.objects.all()}
    assert set(events) == {sent.id, failed.id, dead.id}  # retries in between reported nothing
    assert (events[sent.id].status, events[sent.id].attempt_count) == ("SENT", 1)
    assert events[failed.id].status == "FAILED"
    assert (events[dead.id].status, events[dead.id].attempt_count) == ("DEAD_LETTERED", 2)
    sent.refresh_from_db()
    assert events[sent.id].occurred_at == sent.updated_at


def test_a_rolled_back_status_change_leaves_no_webhook_event():
    notification = NotificationFactory(client=ClientFactory(webhook_url="https://h.example.com"))
    with pytest.raises(RuntimeError), transaction.atomic():
        Notification.objects.filter(id=notification.id).update(
            status=Status.FAILED, updated_at=timezone.now()
        )
        assert WebhookEvent.objects.count() == 1  # written with the change...
        raise RuntimeError("abort")
    assert WebhookEvent.objects.count() == 0  # ...and gone with it


def test_heartbeat_row_tracks_a_live_worker(close_workers):
    from delivery.models import WorkerHeartbeat

    worker = worker_build()
    close_workers(worker)
    assert worker.heartbeat.run_once(delivered=0, waiting=False) == 0  # no stale marks
    beat = WorkerHeartbeat.objects.get(worker_id=worker.worker_id)
    assert beat.stopped_at is None
    assert timezone.now() - beat.last_seen_at < timedelta(seconds=5)


def test_idle_worker_wakes_on_insert_long_before_its_poll_interval():
    """With a 10 s poll interval, only LISTEN/NOTIFY can deliver within a couple of seconds."""
    from delivery.worker import Worker, WorkerConfig
    from tests.support.delivery_helpers import simulated_providers

    worker = Worker(
        providers=simulated_providers(),
        config=WorkerConfig(concurrency=2, batch_size=10, poll_interval_s=10, heartbeat_s=30),
        policy=RetryPolicy(base_s=0.5, max_s=60),
    )
    thread = threading.Thread(target=lambda: (worker.run(), connections.close_all()))
    thread.start()
    try:
        time.sleep(0.5)  # the worker has found nothing and is waiting on LISTEN
        created = time.monotonic()
        notification = NotificationFactory()
        deadline = created + 5
        while time.monotonic() < deadline:
            notification.refresh_from_db()
            if notification.status == Status.SENT:
                break
            time.sleep(0.01)
        latency = time.monotonic() - created
    finally:
        worker.stop()
        thread.join(timeout=15)
    assert notification.status == Status.SENT
    assert latency < 5, latency
    print(f"wake-up to SENT: {latency * 1000:.0f} ms")


def test_concurrency_is_the_number_of_deliveries_in_flight_at_once():
    from delivery.providers.http import HttpProvider
    from tests.integration.test_providers import ScriptedServer

    server = ScriptedServer([(200, {"message_id": f"m-{i}"}) for i in range(8)], delay_s=0.3)
    in_flight, peak, lock = [0], [0], threading.Lock()
    original = HttpProvider.send

    def counting_send(self, message):
        with lock:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
        try:
            return original(self, message)
        finally:
            with lock:
                in_flight[0] -= 1

    provider = HttpProvider(url=server.url, timeout_s=5)
    provider.send = counting_send.__get__(provider)
    NotificationFactory.create_batch(8, client=ClientFactory())
    worker = worker_build(providers={"email": provider}, concurrency=4, batch_size=8)
    try:
        worker.run(until_empty=True)
    finally:
        server.close()
    assert Notification.objects.filter(status=Status.SENT).count() == 8
    assert peak[0] == 4  # overlapped, never more than --concurrency


def test_a_stuck_webhook_receiver_does_not_hold_up_notification_delivery(settings):
    from tests.support.webhook_receiver import Reply, WebhookReceiver
    from webhooks.sender import WebhookSender

    settings.NOTIFYQUEUE_WEBHOOK_ALLOW_PRIVATE = True
    settings.NOTIFYQUEUE_WEBHOOK_TIMEOUT_SECONDS = 30
    held = threading.Event()
    with WebhookReceiver(default=Reply(hold=held)) as receiver:
        client = ClientFactory(webhook_url=receiver.url)
        first = NotificationFactory(client=client)
        sender = WebhookSender(poll_interval_s=0.05, reclaim_interval_s=5)
        sender.start()
        worker = worker_build(concurrency=2, batch_size=5)
        try:
            worker.run(until_empty=True)  # delivers `first`; its webhook is now being posted
            receiver.wait_for(1)
            later = NotificationFactory.create_batch(10, client=client)
            worker = worker_build(concurrency=2, batch_size=5)
            worker.run(until_empty=True)
            statuses = set(
                Notification.objects.filter(id__in=[n.id for n in later]).values_list(
                    "status", flat=True
                )
            )
            assert statuses == {Status.SENT}
            # The client's share of POSTs, all still hanging.
            assert len(receiver.requests) <= settings.NOTIFYQUEUE_WEBHOOK_CLIENT_CONCURRENCY
        finally:
            held.set()
            sender.stop()
            sender.join()
    first.refresh_from_db()
    assert first.status == Status.SENT


def test_worker_survives_losing_its_database_connections():
    """Every connection of the worker is terminated while it idles; it logs, reconnects and
    delivers what arrives next."""
    from django.db import connection

    worker = worker_build(concurrency=2)
    thread = threading.Thread(target=lambda: (worker.run(), connections.close_all()))
    thread.start()
    try:
        first = NotificationFactory()
        deadline = time.monotonic() + 10
        while Notification.objects.get(id=first.id).status != Status.SENT:
            assert time.monotonic() < deadline, "first notification never sent"
            time.sleep(0.02)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            (terminated,) = cursor.fetchone()
        assert terminated >= 2  # the worker's own connection and its listener at least
        second = NotificationFactory()
        deadline = time.monotonic() + 10
        while Notification.objects.get(id=second.id).status != Status.SENT:
            assert time.monotonic() < deadline, "worker did not recover"
            time.sleep(0.02)
    finally:
        worker.stop()
        thread.join(timeout=15)
    assert not thread.is_alive()


def test_a_critical_created_while_the_worker_is_busy_goes_out_next(close_workers):
    """One slot, batch size 10, nine NORMAL rows waiting: the worker holds one claim only, so
    a CRITICAL created while that send hangs is the very next one sent (on main it went out
    ninth of nine, behind the hoarded batch)."""
    from delivery.providers.http import HttpProvider
    from tests.support.http_servers import LoopbackProvider

    provider = LoopbackProvider(hold=True)
    url = provider.start()
    client = ClientFactory()
    NotificationFactory.create_batch(9, client=client)
    worker = worker_build(
        providers={"email": HttpProvider(url=url, timeout_s=10)}, concurrency=1, batch_size=10
    )
    close_workers(worker)
    try:
        assert worker.run_once().claimed == 1
        assert provider.received.wait(10)
        assert Notification.objects.filter(status=Status.PROCESSING).count() == 1
        critical = NotificationFactory(client=client, priority=0)
        provider.hold = False
        provider.release.set()
        while Notification.objects.filter(status=Status.PENDING).exists():
            worker.run_once(wait_s=0.5)
        while worker.run_once(wait_s=0.5).in_flight:
            pass
    finally:
        provider.stop()
    order = [call.body["id"] for call in provider.calls]
    assert order[1] == str(critical.id), order
    assert len(order) == 10


class TurnstileProvider:
    """Answers one call each time the test lets one through, so which waiting claim a freed
    thread starts is observable in the order of the calls."""

    name = "turnstile"

    def __init__(self) -> None:
        self.calls: list[uuid.UUID] = []
        self.turns = threading.Semaphore(0)
        self._lock = threading.Lock()

    def send(self, message):
        from delivery.providers.base import Accepted

        with self._lock:
            self.calls.append(message.notification_id)
        assert self.turns.acquire(timeout=10)
        return Accepted(message_id=f"t-{message.notification_id}")

    def wait_for(self, count: int) -> None:
        deadline = time.monotonic() + 10
        while len(self.calls) < count:
            assert time.monotonic() < deadline, self.calls
            time.sleep(0.005)


def test_a_critical_claimed_while_normal_rows_wait_for_a_thread_passes_them(close_workers):
    """Four send threads, two claims held ready for them: with four NORMAL sends hanging and
    one NORMAL claim waiting, a CRITICAL created now is claimed into a waiting place, and the
    first thread to free starts it, before the NORMAL claim that waited longer."""
    provider = TurnstileProvider()
    client = ClientFactory()
    normal = NotificationFactory.create_batch(5, client=client)
    worker = worker_build(providers={"email": provider}, concurrency=4, batch_size=10)
    close_workers(worker)
    assert worker.run_once().claimed == 5  # four sends and one waiting
    provider.wait_for(4)
    critical = NotificationFactory(client=client, priority=0)
    assert worker.run_once().claimed == 1  # the last waiting place
    provider.turns.release()  # one send answers; its thread starts the next waiting claim
    provider.wait_for(5)
    assert provider.calls[4] == critical.id, provider.calls
    provider.turns.release(10)
    while worker.run_once(wait_s=0.5).in_flight:
        pass
    assert len(provider.calls) == 6
    assert sorted(provider.calls[:4] + provider.calls[5:]) == sorted(n.id for n in normal)
    assert set(Notification.objects.values_list("status", flat=True)) == {Status.SENT}


def test_claims_waiting_for_a_thread_at_shutdown_are_given_back_unsent(close_workers):
    """SIGTERM while two sends hang and one claim waits for a thread: the two are recorded
    when they answer, the waiting one goes back to PENDING with its attempt returned."""
    provider = TurnstileProvider()
    NotificationFactory.create_batch(3)
    worker = worker_build(providers={"email": provider}, concurrency=2, batch_size=10)
    close_workers(worker)
    assert worker.run_once().claimed == 3  # two sends and one waiting
    provider.wait_for(2)
    worker.stop()
    provider.turns.release(2)
    while worker.run_once(wait_s=0.5).in_flight:
        pass
    sent = set(Notification.objects.filter(status=Status.SENT).values_list("id", flat=True))
    assert set(provider.calls) == sent
    assert len(sent) == 2
    waiting = Notification.objects.get(status=Status.PENDING)
    assert waiting.attempt_count == 0
    assert DeliveryAttempt.objects.get(notification=waiting).outcome == Outcome.RELEASED


def test_a_claim_too_old_to_start_is_given_back_without_using_an_attempt(close_workers):
    """The send-time checks outlasted the claim's safe start (claim timeout minus provider
    timeout): the row is released unsent, its attempt and rate-limit slot returned, instead
    of being dropped to wait for the reaper."""
    from ratelimits.repositories import RateLimitRepository
    from ratelimits.services import RateLimit

    class SlowRateLimits(RateLimitRepository):
        def recipients_admit(self, **kwargs):
            admitted = super().recipients_admit(**kwargs)
            time.sleep(0.3)  # e.g. waiting for the recipients' locks
            return admitted

    notification = NotificationFactory()
    worker = worker_build(
        concurrency=1,
        claim_timeout_s=0.4,
        send_timeout_s=0.2,
        rate_limit=RateLimit(limit=10, window_s=60),
        rate_limits=SlowRateLimits(),
    )
    close_workers(worker)
    assert worker.run_once().claimed == 1
    worker.stop()
    while worker.run_once(wait_s=0.5).in_flight:
        pass
    notification.refresh_from_db()
    assert (notification.status, notification.attempt_count) == (Status.PENDING, 0)
    assert not SimulatedProviderMessage.objects.exists()  # never sent
    assert DeliveryAttempt.objects.get(notification=notification).outcome == Outcome.RELEASED
    from ratelimits.models import RecipientDelivery

    assert not RecipientDelivery.objects.exists()  # the slot it was admitted to is free again


def test_a_database_error_in_the_send_time_checks_is_a_failed_attempt_not_a_send(
    clock, close_workers
):
    from django.db import OperationalError

    from ratelimits.services import RateLimit

    class UnreachableRateLimits:
        def recipients_admit(self, **kwargs):
            raise OperationalError("server closed the connection unexpectedly")

    notification = NotificationFactory()
    clock.now = timezone.now()
    worker = worker_build(
        concurrency=1,
        rate_limit=RateLimit(limit=10, window_s=60),
        rate_limits=UnreachableRateLimits(),
    )
    close_workers(worker)
    assert worker.run_once().claimed == 1
    worker.stop()  # no further claims: just collect this one
    while worker.run_once(wait_s=0.5).in_flight:
        pass
    notification.refresh_from_db()
    assert notification.status == Status.PENDING
    assert notification.attempt_count == 1  # counted, so a row that always fails runs out
    assert notification.due_at > clock.now  # and it backs off
    assert "send-time checks failed" in notification.last_error
    assert not SimulatedProviderMessage.objects.exists()  # never sent
    outcome = DeliveryAttempt.objects.get(notification=notification).outcome
    assert outcome == Outcome.TEMPORARY_FAILURE


def test_a_connection_lost_in_the_send_time_checks_gives_the_claim_back_unspent(
    clock, close_workers
):
    """The database goes away between the claim and its admission (a restart, a failover):
    the row did nothing wrong, so it is given back with its attempt returned, not counted as a
    failed attempt, once the database answers again."""
    from django.db import DatabaseError, connection

    from ratelimits.services import RateLimit

    class ConnectionLost:
        def recipients_admit(self, **kwargs):
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")

    notification = NotificationFactory()
    clock.now = timezone.now()
    worker = worker_build(
        concurrency=1,
        rate_limit=RateLimit(limit=10, window_s=60),
        rate_limits=ConnectionLost(),
    )
    close_workers(worker)
    with pytest.raises(DatabaseError):  # the step's results cannot be written: kept
        worker.run_once()
    connection.close()  # what the loop does before its next turn
    worker.stop()
    while worker.run_once(wait_s=0.5).in_flight:
        pass
    notification.refresh_from_db()
    assert (notification.status, notification.attempt_count) == (Status.PENDING, 0)
    assert notification.last_error is None
    assert not SimulatedProviderMessage.objects.exists()  # never sent
    assert DeliveryAttempt.objects.get(notification=notification).outcome == Outcome.RELEASED


def test_a_failed_admission_of_a_whole_claim_is_retried_row_by_row(clock, close_workers):
    """The claim's one admission statement fails (a deadlock, say): each row is admitted on its
    own, so only a row that fails alone too pays an attempt; the others are sent."""
    from django.db import DataError, OperationalError

    from ratelimits.repositories import RateLimitRepository
    from ratelimits.services import RateLimit

    class BatchFailing(RateLimitRepository):
        def recipients_admit(self, *, claims, **limits):
            if len(claims) > 1:
                raise OperationalError("deadlock detected")
            if claims[0].recipient == "poison@example.com":
                raise DataError("cannot admit this one")
            return super().recipients_admit(claims=claims, **limits)

    client = ClientFactory()
    good = NotificationFactory.create_batch(3, client=client)
    poison = NotificationFactory(client=client, recipient="poison@example.com")
    clock.now = timezone.now()
    worker = worker_build(
        concurrency=4,
        batch_size=4,
        rate_limit=RateLimit(limit=10, window_s=60),
        rate_limits=BatchFailing(),
    )
    close_workers(worker)
    assert worker.run_once().claimed == 4
    worker.stop()
    while worker.run_once(wait_s=0.5).in_flight:
        pass
    for notification in good:
        notification.refresh_from_db()
        assert (notification.status, notification.attempt_count) == (Status.SENT, 1)
    poison.refresh_from_db()
    assert (poison.status, poison.attempt_count) == (Status.PENDING, 1)
    assert "send-time checks failed: DataError" in poison.last_error
    assert not SimulatedProviderMessage.objects.filter(recipient="poison@example.com").exists()


def test_until_empty_drains_past_a_fair_claim_that_came_back_short():
    """One client with 1 due row, another with 30, batch 10: the fair claim gives each at most
    its share (5), so the first claim is short while rows are still due; --until-empty must
    not take that for an empty queue."""
    NotificationFactory(client=ClientFactory())
    NotificationFactory.create_batch(30, client=ClientFactory())
    worker = worker_build(concurrency=4, batch_size=10)
    worker.run(until_empty=True)
    assert Notification.objects.filter(status=Status.SENT).count() == 31


def test_a_stop_during_the_send_time_checks_gives_the_claim_back_unsent(close_workers):
    """SIGTERM (stop()) arrives while the loop is admitting its claim: nothing of that claim is
    started; every row is back to PENDING with its attempt and rate-limit slot returned."""
    from ratelimits.models import RecipientDelivery
    from ratelimits.repositories import RateLimitRepository
    from ratelimits.services import RateLimit

    class StoppedMidway(RateLimitRepository):
        def recipients_admit(self, **kwargs):
            admitted = super().recipients_admit(**kwargs)
            worker.stop()
            return admitted

    worker = worker_build(
        concurrency=4,
        batch_size=4,
        rate_limit=RateLimit(limit=10, window_s=60),
        rate_limits=StoppedMidway(),
    )
    notifications = NotificationFactory.create_batch(3, client=ClientFactory())
    close_workers(worker)
    assert worker.run_once().claimed == 3
    for notification in notifications:
        notification.refresh_from_db()
        assert (notification.status, notification.attempt_count) == (Status.PENDING, 0)
    assert not SimulatedProviderMessage.objects.exists()
    assert set(DeliveryAttempt.objects.values_list("outcome", flat=True)) == {Outcome.RELEASED}
    assert not RecipientDelivery.objects.exists()


def test_a_busy_worker_checks_the_statistics_every_second_and_reclaims_at_its_heartbeat():
    """The statistics check has its own timer (STATISTICS_CHECK_S): a burst drains in seconds,
    and a check only at the heartbeat let it be claimed with an empty queue's plans. The
    heartbeat itself beats on its own thread, started at the first turn."""
    from delivery.services import RetryPolicy
    from delivery.upkeep import STATISTICS_CHECK_S
    from delivery.worker import Worker, WorkerConfig

    worker = Worker(
        providers=simulated_providers(),
        config=WorkerConfig(heartbeat_s=60.0),
        policy=RetryPolicy(base_s=0.5, max_s=60.0),
    )
    calls = []
    worker.heartbeat.start = lambda **_: calls.append("heartbeat started")
    worker.reclaimer.run_once = lambda: calls.append("reclaim") and 0
    worker.statistics.run_once = lambda **_: calls.append("statistics") or []

    for now in (1000.0, 1000.0 + STATISTICS_CHECK_S / 2, 1000.0 + STATISTICS_CHECK_S * 1.5):
        worker._maintain(now)
    assert calls == ["heartbeat started", "reclaim", "statistics", "statistics"]
    # The first interval's history partitions and receipts sweep, left over (one job a turn).
    worker._maintain(1061.0)
    worker._maintain(1061.0)
    worker._maintain(1061.0)
    assert calls[4:] == ["statistics", "reclaim"]


def test_the_upkeep_runs_one_job_a_turn():
    """Run in one turn, the upkeep held up that turn, and every row created meanwhile, for
    10-20 ms (30-150 ms on a busy host): each job has a turn of its own, the next at once."""
    from delivery.services import RetryPolicy
    from delivery.worker import Worker, WorkerConfig

    worker = Worker(
        providers=simulated_providers(),
        config=WorkerConfig(heartbeat_s=60.0),
        policy=RetryPolicy(base_s=0.5, max_s=60.0),
    )
    calls = []
    worker.heartbeat.start = lambda **_: None
    worker.reclaimer.run_once = lambda: calls.append("reclaim") and 0
    worker.expiry.run_once = lambda: calls.append("expiry") and 0
    worker.digests.run_once = lambda: calls.append("digests") and 0
    worker.receipt_upkeep.run_once = lambda: calls.append("receipts") and (0, 0)
    worker.history.run_once = lambda: calls.append("history") and []
    worker.statistics.run_once = lambda **_: []

    turns = []
    for now in (1000.0, 1000.1, 1000.2, 1000.3, 1000.4, 1000.5):
        before = len(calls)
        worker._maintain(now)
        turns.append(calls[before:])
    assert turns == [["reclaim"], ["expiry"], ["digests"], ["history"], ["receipts"], []]
    worker._maintain(1061.0)
    assert calls[5:] == ["reclaim"]


def test_a_burst_of_rows_gets_the_hot_tables_analyzed_at_the_next_check(queue_without_autovacuum):
    """Autoanalyze waits for 10 % of a table to change; until it comes round the planner
    thinks a burst of due rows is one row and every claim may read the whole backlog. The
    worker's maintenance analyzes a hot table once it changed by more than
    STATISTICS_STALE_ROWS rows (and STATISTICS_STALE_FRACTION of it), and not before.
    (Autovacuum, kept off the queue here, analyzes a small table after 50 changes: it would
    reset the counter this test reads before the worker's refresh runs.)"""
    from django.db import connection

    from delivery.upkeep import STATISTICS_STALE_ROWS

    def changes_since_analyze() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_force_next_flush()")
            cursor.execute(
                "SELECT n_mod_since_analyze FROM pg_stat_user_tables "
                "WHERE relname = 'notification_queue'"
            )
            return cursor.fetchone()[0]

    worker = worker_build()
    NotificationFactory.create_batch(STATISTICS_STALE_ROWS + 100, client=ClientFactory())
    deadline = time.monotonic() + 10
    while changes_since_analyze() <= STATISTICS_STALE_ROWS:
        assert time.monotonic() < deadline, "the counters never reached pg_stat_user_tables"
        time.sleep(0.1)  # they get there at the end of a transaction
    refreshed = worker.statistics.run_once()
    assert "notification_queue" in refreshed
    assert "notification" not in refreshed  # the record is read by primary key only
    assert changes_since_analyze() < STATISTICS_STALE_ROWS
    # A small sample, as the refresh runs on the worker's loop: statistics target 10, so
    # at most 11 histogram bounds for 2,100 distinct ids (the default target keeps 101).
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT cardinality(histogram_bounds::text::text[]) FROM pg_stats "
            "WHERE tablename = 'notification_queue' AND attname = 'id'"
        )
        assert cursor.fetchone()[0] <= 11
    assert "notification_queue" not in worker.statistics.run_once()  # nothing changed since


def test_the_statistics_refresh_skips_a_table_autovacuum_holds_instead_of_waiting(
    database_url,
):
    """Autovacuum holds SHARE UPDATE EXCLUSIVE on the table it works on, for seconds on a large
    one, and an ANALYZE needs the same lock: the refresh runs on the worker's loop, so it must
    skip that table, not wait. Here another connection holds the lock for 5 s."""
    import psycopg

    worker = worker_build()
    with psycopg.connect(database_url) as other:
        other.execute("ANALYZE notification_queue")  # so its row count can be found stale
        other.commit()
        other.execute("LOCK TABLE notification_queue IN SHARE UPDATE EXCLUSIVE MODE")
        releaser = threading.Timer(5.0, other.rollback)
        releaser.start()
        try:
            started = time.monotonic()
            # The queue is stale: the planner counts fewer rows in it than a claim just took.
            stale = worker.repository.statistics_refresh(
                changes=1_000_000, fraction=1.0, queue_rows=1_000_000
            )
            took = time.monotonic() - started
        finally:
            releaser.cancel()  # the lock goes with the connection
            releaser.join()
    assert stale == ["notification_queue"]
    assert took < 2.0, f"the refresh waited {took:.1f} s for the lock"


def test_a_burst_after_a_quiet_spell_has_the_queue_analyzed_before_its_second_claim(
    close_workers, queue_without_autovacuum
):
    """The change counters reach pg_stat_user_tables up to a second after a burst's commit,
    after the NOTIFY that wakes the workers; meanwhile the planner counts the rows the queue
    held when last analyzed (none) and each claim sorted the whole burst (45 ms a claim of 100
    at 20,000 waiting). The first full claim after a short one proves the queue holds at least
    that many rows: the next turn analyzes it when the planner counts fewer. Later full claims
    of the same burst leave the check to its timer."""
    from django.db import connection

    def planner_rows() -> float:
        with connection.cursor() as cursor:
            cursor.execute("SELECT reltuples FROM pg_class WHERE relname = 'notification_queue'")
            return cursor.fetchone()[0]

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE notification_queue")
    assert planner_rows() == 0
    worker = worker_build(batch_size=10)
    close_workers(worker)
    worker._maintain(time.monotonic())  # the heartbeat and a first check, both due at start
    assert worker.run_once().claimed == 0  # quiet: a short claim
    NotificationFactory.create_batch(35, client=ClientFactory())
    assert worker.run_once().claimed == 10  # the burst's first claim, full
    worker._maintain(time.monotonic())  # the next turn: checked at once, not in a second
    assert planner_rows() == 25  # analyzed: the 25 still waiting (the 10 are SENT)

    scheduled = worker._next_statistics_check
    assert worker.run_once().claimed == 10  # full again: the same burst, no new check
    assert worker._next_statistics_check == scheduled


def test_a_batch_provider_that_raises_fails_each_row_of_its_batch_temporarily(close_workers):
    """A provider that takes a whole claim at once raises: whether any was sent is unknown,
    so every row of the batch is a failed attempt, retried later under the same key; the
    claim never waits out its timeout."""

    class Exploding:
        name = "exploding"

        def send(self, message):
            raise AssertionError("the worker hands this provider whole batches")

        def send_batch(self, messages):
            raise RuntimeError("store unreachable")

    notifications = NotificationFactory.create_batch(3, client=ClientFactory())
    worker = worker_build(providers={"email": Exploding()}, concurrency=1, batch_size=3)
    close_workers(worker)
    assert worker.run_once().claimed == 3  # one step: a batch provider finishes within it
    for notification in notifications:
        notification.refresh_from_db()
        assert (notification.status, notification.attempt_count) == (Status.PENDING, 1)
        assert notification.last_error == "exploding provider raised RuntimeError"
