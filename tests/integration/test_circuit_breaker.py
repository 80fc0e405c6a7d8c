"""The per-provider circuit breaker on real PostgreSQL: its states, the one-probe guarantee
across threads and across `run_worker` processes, and proof the provider is not called
while the circuit is open."""

from __future__ import annotations

import signal
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from delivery.circuits.models import CircuitBreaker, CircuitState
from delivery.circuits.repositories import CircuitRepository, circuits_list
from delivery.circuits.services import CircuitPolicy, circuits_register
from delivery.models import DeliveryAttempt, SimulatedProviderMessage
from delivery.providers.simulated import SimulatedProvider
from notifications.models import Notification, Status
from tests.integration.test_worker_process import wait_for, worker_process
from tests.support.clock import DbClock
from tests.support.delivery_helpers import FakeClock, worker_build
from tests.support.factories import ClientFactory, NotificationFactory
from tests.support.races import run_in_threads
from webhooks.models import WebhookEvent

pytestmark = pytest.mark.django_db(transaction=True)

# No reuse of readings: the tests move the database clock and expect the next call to see it.
POLICY = CircuitPolicy(threshold=3, cooldown_s=30, probe_timeout_s=10, read_ttl_s=0)
EMAIL = "email:simulated"


class StateRecordingProvider:
    """The simulated provider, noting the email circuit's state at each call it receives."""

    name = "simulated"

    def __init__(self) -> None:
        self.inner = SimulatedProvider()
        self.states: list[str] = []

    def send(self, message):
        self.states.append(circuit(EMAIL).state)
        return self.inner.send(message)


def circuit(name: str):
    return next(c for c in circuits_list() if c.name == name)


def deliver_due(worker) -> None:
    """Steps the worker until what it claimed has been delivered and recorded."""
    finished = 0
    for _ in range(40):
        step = worker.run_once(wait_s=0.5)
        finished += step.finished
        if finished and not step.in_flight and not step.claimed:
            return
    raise AssertionError("nothing was delivered")


def calls_for(notification) -> int:
    row = SimulatedProviderMessage.objects.filter(idempotency_key__startswith=str(notification.id))
    return sum(row.values_list("calls", flat=True))


@pytest.fixture
def breaker_worker():
    clock = FakeClock()
    provider = StateRecordingProvider()
    worker = worker_build(providers={"email": provider}, circuit=POLICY)
    circuits_register(list(worker.circuits.values()))  # as the first turn of Worker.run() does
    worker.circuits_test_clock, worker.test_provider = clock, provider
    yield worker
    worker.stop()
    worker._shutdown()


def test_the_breaker_walks_closed_open_half_open_closed_and_open_means_no_call(breaker_worker):
    worker, clock, provider = (
        breaker_worker,
        breaker_worker.circuits_test_clock,
        breaker_worker.test_provider,
    )
    client = ClientFactory()
    failing = NotificationFactory(
        client=client, recipient="temporary-failure@example.com", max_attempts=3
    )
    clock.now = failing.due_at
    for _ in range(3):  # three temporary failures in a row, moving the clock past each backoff
        deliver_due(worker)
        failing.refresh_from_db()
        clock.now = max(clock.now, failing.due_at)
    assert failing.status == Status.DEAD_LETTERED
    opened = circuit(EMAIL)
    assert (opened.state, opened.consecutive_failures) == (CircuitState.OPEN, 3)
    assert provider.states == [CircuitState.CLOSED] * 3

    # OPEN: deliveries fail fast and the provider is not called at all; each is held until
    # the probe time without using an attempt.
    waiting = NotificationFactory.create_batch(3, client=client, due_at=clock.now)
    deliver_due(worker)
    assert len(provider.states) == 3  # no new call
    assert [calls_for(n) for n in waiting] == [0, 0, 0]
    probe_at = opened.opened_at + timedelta(seconds=POLICY.cooldown_s)
    for notification in waiting:
        notification.refresh_from_db()
        assert (notification.status, notification.attempt_count) == (Status.PENDING, 0)
        assert (notification.due_at, notification.last_error) == (probe_at, None)
    assert circuit(EMAIL).state == CircuitState.OPEN

    # After the cooldown exactly one probe goes through, seen by the provider as HALF_OPEN;
    # its success closes the circuit and lets the rows it held go at once.
    clock.advance(POLICY.cooldown_s)
    deliver_due(worker)
    assert provider.states[3:] == [CircuitState.HALF_OPEN, CircuitState.CLOSED, CircuitState.CLOSED]
    closed = circuit(EMAIL)
    assert (closed.state, closed.consecutive_failures, closed.opened_at) == (
        CircuitState.CLOSED,
        0,
        None,
    )
    statuses = Notification.objects.filter(id__in=[n.id for n in waiting])
    assert set(statuses.values_list("status", flat=True)) == {Status.SENT}


def test_a_failed_probe_reopens_the_circuit_for_another_cooldown(breaker_worker):
    worker, clock, provider = (
        breaker_worker,
        breaker_worker.circuits_test_clock,
        breaker_worker.test_provider,
    )
    repository = CircuitRepository()
    repository.register(names=[EMAIL])
    for _ in range(3):
        repository.failed(name=EMAIL, threshold=3)
    clock.advance(POLICY.cooldown_s)
    probe = NotificationFactory(recipient="temporary-failure@example.com", due_at=clock.now)
    deliver_due(worker)
    assert provider.states == [CircuitState.HALF_OPEN]
    reopened = circuit(EMAIL)
    assert (reopened.state, reopened.opened_at) == (CircuitState.OPEN, clock.now)

    clock.advance(POLICY.cooldown_s - 1)  # the new cooldown counts from the failed probe
    probe.refresh_from_db()
    Notification.objects.filter(id=probe.id).update(due_at=clock.now)
    deliver_due(worker)
    assert len(provider.states) == 1
    probe.refresh_from_db()
    assert (probe.status, probe.attempt_count) == (Status.PENDING, 1)  # the probe's attempt only
    # Due at the probe time, a millisecond per attempt used behind the rows tried less.
    assert probe.due_at == reopened.opened_at + timedelta(seconds=POLICY.cooldown_s, milliseconds=1)
    assert probe.circuit_held_since == clock.now


def test_exactly_one_of_many_concurrent_callers_gets_the_probe():
    repository = CircuitRepository()
    clock = DbClock()
    repository.register(names=[EMAIL])
    repository.failed(name=EMAIL, threshold=1)
    clock.advance(60)
    callers = 12

    def take(_, barrier):
        barrier.wait()
        return CircuitRepository().probe_take(name=EMAIL, cooldown_s=30, probe_timeout_s=10)

    tokens = run_in_threads(callers, take)
    assert len([t for t in tokens if t is not None]) == 1
    row = CircuitBreaker.objects.get(name=EMAIL)
    assert (row.state, row.probe_token) == (CircuitState.HALF_OPEN, next(t for t in tokens if t))


def test_a_probe_whose_worker_died_expires_and_only_the_new_holder_decides():
    repository = CircuitRepository()
    clock = DbClock()
    repository.failed(name=EMAIL, threshold=1)
    clock.advance(30)
    lost = repository.probe_take(name=EMAIL, cooldown_s=30, probe_timeout_s=10)
    assert lost is not None
    clock.advance(9)
    assert repository.probe_take(name=EMAIL, cooldown_s=30, probe_timeout_s=10) is None
    clock.advance(1)
    taken_over = repository.probe_take(name=EMAIL, cooldown_s=30, probe_timeout_s=10)
    assert taken_over not in (None, lost)
    assert repository.probe_finished(name=EMAIL, token=lost, failed=False) is False
    assert circuit(EMAIL).state == CircuitState.HALF_OPEN
    assert repository.probe_finished(name=EMAIL, token=taken_over, failed=False)
    assert circuit(EMAIL).state == CircuitState.CLOSED


def test_a_late_result_from_before_the_circuit_opened_changes_nothing():
    repository = CircuitRepository()
    clock = DbClock()
    now = clock.now
    for _ in range(2):
        repository.failed(name=EMAIL, threshold=2)
    repository.succeeded(name=EMAIL)  # admitted while CLOSED, answered after opening
    clock.advance(5)
    repository.failed(name=EMAIL, threshold=2)
    row = circuit(EMAIL)
    assert (row.state, row.consecutive_failures, row.opened_at) == (CircuitState.OPEN, 2, now)


def test_a_permanent_rejection_or_success_ends_a_failure_run(breaker_worker):
    worker, clock = breaker_worker, breaker_worker.circuits_test_clock
    repository = CircuitRepository()
    for _ in range(2):
        repository.failed(name=EMAIL, threshold=3)
    NotificationFactory(recipient="permanent-failure@example.com", due_at=clock.now)
    deliver_due(worker)
    assert (circuit(EMAIL).state, circuit(EMAIL).consecutive_failures) == (CircuitState.CLOSED, 0)


@pytest.mark.slow
def test_two_worker_processes_in_half_open_send_one_probe_not_two(loopback, database_url):
    client = ClientFactory()
    notifications = NotificationFactory.create_batch(10, client=client, max_attempts=500)
    # The http email provider's circuit opened an hour ago: its cooldown has long passed.
    CircuitBreaker.objects.create(
        name="email:http",
        state=CircuitState.OPEN,
        consecutive_failures=5,
        opened_at=timezone.now() - timedelta(hours=1),
        updated_at=timezone.now(),
    )
    loopback.hold = True  # the probe's call hangs until the test releases it
    env = {
        "NOTIFYQUEUE_PROVIDER_TIMEOUT_SECONDS": "30",
        "NOTIFYQUEUE_BACKOFF_BASE_SECONDS": "0.05",
        "NOTIFYQUEUE_BACKOFF_MAX_SECONDS": "0.2",
        # Held rows come back every half second while the probe hangs, so both processes
        # keep claiming and refusing them.
        "NOTIFYQUEUE_CIRCUIT_COOLDOWN_SECONDS": "0.5",
    }
    workers = [
        worker_process(database_url, loopback.url, "--concurrency", "2", "--batch-size", "2", **env)
        for _ in range(2)
    ]
    try:
        assert loopback.received.wait(30), "no probe reached the provider"
        # A held row keeps the name of the worker whose claim the circuit refused.
        held = Notification.objects.filter(status=Status.PENDING, circuit_held_since__isnull=False)

        def both_processes_refused() -> bool:
            pids = {worker.split(":")[1] for worker in held.values_list("claimed_by", flat=True)}
            return pids == {str(w.pid) for w in workers}

        wait_for(both_processes_refused, timeout_s=30, what="both processes to fail fast")
        assert len(loopback.calls) == 1  # one probe across both processes
        assert CircuitBreaker.objects.get(name="email:http").state == CircuitState.HALF_OPEN

        loopback.hold = False
        loopback.release.set()
        sent = Notification.objects.filter(status=Status.SENT)
        wait_for(lambda: sent.count() == len(notifications), timeout_s=30, what="all sent")
    finally:
        loopback.release.set()
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
    for worker in workers:
        output, _ = worker.communicate(timeout=30)
        assert worker.returncode == 0, output
    assert len(loopback.calls) == len(notifications)  # the probe, then one call per other one
    assert len(loopback.sent) == len(notifications)
    assert CircuitBreaker.objects.get(name="email:http").state == CircuitState.CLOSED


def test_a_closed_circuit_costs_one_read_per_ttl_and_no_write_per_success():
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from delivery.circuits.services import Allowed, Circuit
    from delivery.providers.base import Accepted, TemporaryFailure

    policy = CircuitPolicy(threshold=3, cooldown_s=30, probe_timeout_s=10, read_ttl_s=60)
    breaker = Circuit("email:simulated", policy)
    circuits_register([breaker])
    with CaptureQueriesContext(connection) as queries:
        for _ in range(20):
            admission = breaker.admit()
            assert admission == Allowed()
            breaker.record(admission, Accepted("m"))
    assert len(queries) == 1  # one read, reused; successes with no failure run write nothing

    breaker.record(Allowed(), TemporaryFailure("busy"))
    with CaptureQueriesContext(connection) as queries:
        admission = breaker.admit()
        breaker.record(admission, Accepted("m"))
    # After a failure the state is read again, and the success that ends the run resets it.
    assert len(queries) == 2
    assert CircuitBreaker.objects.get(name="email:simulated").consecutive_failures == 0


def test_the_probe_is_due_by_the_database_clock_after_the_cooldown_or_an_expired_probe():
    """The cooldown and the probe's expiry are read against notifyqueue_now(), so a worker
    whose own clock is off neither probes early nor waits late."""
    repository = CircuitRepository()
    clock = DbClock()
    repository.failed(name=EMAIL, threshold=1)

    def due() -> bool:
        return repository.read(name=EMAIL, cooldown_s=30).probe_due

    clock.advance(29.9)
    assert not due()
    clock.advance(0.1)
    assert due()
    assert repository.probe_take(name=EMAIL, cooldown_s=30, probe_timeout_s=20) is not None
    clock.advance(19)
    assert not due()
    clock.advance(1)
    assert due()  # the probe's worker never answered: it may be taken over
    repository.succeeded(name=EMAIL)
    assert repository.read(name=EMAIL, cooldown_s=30).state == CircuitState.HALF_OPEN


def test_a_worker_whose_connection_drops_as_it_registers_its_circuits_retries_and_delivers(
    monkeypatch,
):
    """The circuits' rows are the worker's first write. A connection terminated at that
    moment (the fault suite's pg_terminate_backend caught one) is retried as any turn of the
    loop is, and the worker goes on: it exited with status 1 before."""
    from django.db import OperationalError

    notification = NotificationFactory()
    register = CircuitRepository.register
    attempts = []

    def dropped_once(self, *, names):
        attempts.append(names)
        if len(attempts) == 1:
            raise OperationalError("server closed the connection unexpectedly")
        return register(self, names=names)

    monkeypatch.setattr(CircuitRepository, "register", dropped_once)
    worker = worker_build(providers={"email": SimulatedProvider()}, circuit=POLICY)

    worker.run(until_empty=True)

    assert attempts == [[EMAIL], [EMAIL]]
    assert circuit(EMAIL).state == CircuitState.CLOSED
    notification.refresh_from_db()
    assert notification.status == Status.SENT


def attempts_of(notifications) -> dict[str, list[str]]:
    """Each notification's recorded attempts, by id: their outcomes in order."""
    rows = DeliveryAttempt.objects.filter(notification_id__in=[n.id for n in notifications])
    found: dict[str, list[str]] = {str(n.id): [] for n in notifications}
    for attempt in rows.order_by("started_at", "number"):
        found[str(attempt.notification_id)].append(attempt.outcome)
    return found


def test_a_circuit_opened_by_real_failures_holds_what_arrives_and_sends_each_once_after(
    breaker_worker, api, acme
):
    """Three real temporary failures open the circuit. Everything that arrives while it is
    open (and the failed rows' retries) is held at the probe time, PENDING, without an
    attempt, a provider call or an attempt row; after the cooldown one probe succeeds, the
    circuit closes and every held notification is sent exactly once, with one attempt."""
    worker, clock, provider = (
        breaker_worker,
        breaker_worker.circuits_test_clock,
        breaker_worker.test_provider,
    )
    client = acme[0]
    flaky = NotificationFactory.create_batch(
        3, client=client, recipient="flaky-1@example.com", due_at=clock.now
    )
    deliver_due(worker)
    opened = circuit(EMAIL)
    assert (opened.state, opened.consecutive_failures) == (CircuitState.OPEN, 3)
    probe_at = opened.opened_at + timedelta(seconds=POLICY.cooldown_s)

    arrived = []
    for _ in range(3):  # arrivals across the cooldown, each delivered while the circuit is open
        clock.advance(9)
        arrived += NotificationFactory.create_batch(4, client=client, due_at=clock.now)
        deliver_due(worker)
    assert len(provider.states) == 3  # only the three failures ever reached the provider
    for notification in arrived:
        notification.refresh_from_db()
        assert (notification.status, notification.attempt_count) == (Status.PENDING, 0)
        assert notification.due_at == probe_at
    assert all(outcomes == [] for outcomes in attempts_of(arrived).values())
    for notification in flaky:  # their retries came due while open: held, no second attempt
        notification.refresh_from_db()
        assert (notification.status, notification.attempt_count) == (Status.PENDING, 1)

    # The representation shows the hold, through the API and in the list.
    shown = api.get(f"/api/v1/notifications/{arrived[0].id}").json()
    assert (shown["status"], shown["held_reason"], shown["attempt_count"]) == (
        "PENDING",
        "circuit_open",
        0,
    )
    assert shown["held_until"] == probe_at.isoformat().replace("+00:00", "Z")
    listed = api.get("/api/v1/notifications?status=PENDING").json()["results"]
    assert {row["held_reason"] for row in listed} == {"circuit_open"}

    clock.now = probe_at
    for _ in range(5):
        deliver_due(worker)
        if not Notification.objects.exclude(status=Status.SENT).exists():
            break
    everything = [*flaky, *arrived]
    statuses = Notification.objects.filter(id__in=[n.id for n in everything])
    assert set(statuses.values_list("status", flat=True)) == {Status.SENT}
    assert circuit(EMAIL).state == CircuitState.CLOSED
    assert [calls_for(n) for n in arrived] == [1] * len(arrived)  # each sent once
    assert provider.states.count(CircuitState.HALF_OPEN) == 1  # one probe
    outcomes = attempts_of(arrived)
    assert all(found == ["SENT"] for found in outcomes.values()), outcomes
    assert set(
        statuses.filter(id__in=[n.id for n in arrived]).values_list("attempt_count", flat=True)
    ) == {1}
    assert set(statuses.values_list("circuit_held_since", flat=True)) == {None}
    shown = api.get(f"/api/v1/notifications/{arrived[0].id}").json()
    assert (shown["held_until"], shown["held_reason"]) == (None, None)


def test_a_notification_held_longer_than_the_maximum_hold_is_dead_lettered_saying_so():
    """While another worker's probe hangs, the circuit never closes: the notification is held
    (never past the maximum hold), then DEAD_LETTERED with the reason, still without an
    attempt, and its webhook event is written."""
    policy = CircuitPolicy(
        threshold=1, cooldown_s=30, probe_timeout_s=10, read_ttl_s=0, max_hold_s=45
    )
    provider = StateRecordingProvider()
    worker = worker_build(providers={"email": provider}, circuit=policy)
    repository = CircuitRepository()
    circuits_register(list(worker.circuits.values()))
    clock = DbClock()
    start = clock.now
    repository.failed(name=EMAIL, threshold=1)
    webhooked = ClientFactory(webhook_url="https://hooks.example.com/notify")
    notification = NotificationFactory(client=webhooked, due_at=clock.now)
    try:
        deliver_due(worker)
        notification.refresh_from_db()
        assert (notification.status, notification.attempt_count) == (Status.PENDING, 0)
        assert (notification.due_at, notification.circuit_held_since) == (
            start + timedelta(seconds=30),
            start,
        )

        clock.advance(30)
        assert repository.probe_take(name=EMAIL, cooldown_s=30, probe_timeout_s=1000)
        deliver_due(worker)
        notification.refresh_from_db()
        # HALF_OPEN: held until the probe's answer is due, but never past the maximum hold.
        assert notification.due_at == start + timedelta(seconds=45)
        assert notification.status == Status.PENDING

        clock.advance(15)
        deliver_due(worker)
    finally:
        worker.stop()
        worker._shutdown()
    notification.refresh_from_db()
    assert (notification.status, notification.attempt_count) == (Status.DEAD_LETTERED, 0)
    assert notification.last_error.startswith("circuit_open: held 45 s while the email:simulated")
    assert notification.circuit_held_since is None
    assert provider.states == []  # the provider was never asked
    assert attempts_of([notification]) == {str(notification.id): []}
    assert (
        WebhookEvent.objects.filter(notification_id=notification.id)
        .values_list("status", flat=True)
        .get()
        == Status.DEAD_LETTERED
    )


def test_the_readme_demo_sends_flaky_and_healthy_mail_while_temporary_failures_open_the_circuit():
    """The README's simulated recipients under the product's defaults (6 attempts, backoff
    from 0.5 s, five failures open the circuit for 30 s), with five `temporary-failure`
    rows opening the circuit first and healthy mail arriving every few seconds: `flaky-2`
    ends SENT, every healthy email is sent with one attempt, `permanent-failure` FAILED, and
    only the always-failing rows are DEAD_LETTERED, after six real calls each."""
    policy = CircuitPolicy(threshold=5, cooldown_s=30, probe_timeout_s=20, read_ttl_s=0)
    worker = worker_build(providers={"email": SimulatedProvider()}, circuit=policy, batch_size=50)
    circuits_register(list(worker.circuits.values()))
    clock = DbClock()
    client = ClientFactory()
    failing = [
        NotificationFactory(
            client=client, recipient=f"temporary-failure-{i}@example.com", due_at=clock.now
        )
        for i in range(5)
    ]
    worker.run_once()
    assert circuit(EMAIL).state == CircuitState.OPEN
    flaky = NotificationFactory(client=client, recipient="flaky-2@example.com", due_at=clock.now)
    rejected = NotificationFactory(
        client=client, recipient="permanent-failure@example.com", due_at=clock.now
    )
    healthy = []
    try:
        for second in range(1, 1800):
            if second % 7 == 0 and len(healthy) < 40:
                healthy.append(
                    NotificationFactory(
                        client=client, recipient=f"ada{second}@example.com", due_at=clock.now
                    )
                )
            while worker.run_once().claimed:
                pass
            if not Notification.objects.exclude(
                status__in=[Status.SENT, Status.FAILED, Status.DEAD_LETTERED]
            ).exists():
                break
            clock.advance(1)
    finally:
        worker.stop()
        worker._shutdown()
    everything = Notification.objects.in_bulk([n.id for n in [*failing, flaky, rejected, *healthy]])
    assert everything[flaky.id].status == Status.SENT
    assert everything[flaky.id].attempt_count == 3  # two failures, then accepted
    assert everything[rejected.id].status == Status.FAILED
    assert [everything[n.id].status for n in healthy] == [Status.SENT] * len(healthy)
    assert {everything[n.id].attempt_count for n in healthy} == {1}
    for notification in failing:
        row = everything[notification.id]
        assert (row.status, row.attempt_count, calls_for(row)) == (Status.DEAD_LETTERED, 6, 6)


def test_an_operator_retry_forgets_the_hold_a_notification_ended_on(make_client):
    """A row dead-lettered while it still carried a hold (its result could not be recorded)
    starts afresh when an operator retries it: not shown as held, and its maximum hold counts
    from its next refusal, one by one or in bulk."""
    operator = APIClient()
    operator.credentials(HTTP_AUTHORIZATION=f"Api-Key {make_client('ops', is_operator=True)[1]}")
    one, bulk = NotificationFactory.create_batch(2)
    Notification.objects.filter(id__in=[one.id, bulk.id]).update(
        status=Status.DEAD_LETTERED, circuit_held_since=timezone.now() - timedelta(days=2)
    )
    shown = operator.post(f"/api/v1/notifications/{one.id}/retry").json()
    assert (shown["status"], shown["held_reason"]) == ("PENDING", None)
    answer = operator.post(
        "/api/v1/notifications/retry", {"status": "DEAD_LETTERED"}, format="json"
    )
    assert answer.json()["retried"] == 1
    held_since = Notification.objects.filter(id__in=[one.id, bulk.id]).values_list(
        "circuit_held_since", flat=True
    )
    assert set(held_since) == {None}
