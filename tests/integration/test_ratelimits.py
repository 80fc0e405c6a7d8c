"""Priority order and the per-recipient rolling-window rate limit, on real PostgreSQL."""

from __future__ import annotations

import hashlib
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from clients.models import Client
from delivery.models import DeliveryAttempt, Outcome
from delivery.repositories import DeliveryRepository
from notifications.models import Notification, Priority, Status
from notifyqueue.addresses import recipient_key
from ratelimits.models import RecipientDelivery
from ratelimits.repositories import (
    Admission,
    AdmissionRequest,
    Admitted,
    ClaimLost,
    RateLimitRepository,
)
from ratelimits.services import DEFER_AHEAD_ROWS, RateLimit
from tests.support.delivery_helpers import FakeClock, simulated_providers, step_until_idle
from tests.support.factories import ClientFactory, NotificationFactory
from tests.support.operator_helpers import notifications_insert_bulk
from tests.support.races import run_in_threads
from tests.support.reads import pages_visited_by_relation

pytestmark = pytest.mark.django_db(transaction=True)

WINDOW_S = 60.0


def limited_worker(clock, *, limit=10, batch_size=100, concurrency=4, prune_batch=10_000):
    from delivery.services import RetryPolicy
    from delivery.worker import Worker, WorkerConfig

    return Worker(
        providers=simulated_providers(),
        config=WorkerConfig(
            concurrency=concurrency,
            batch_size=batch_size,
            poll_interval_s=0.05,
            heartbeat_s=60,
            rate_limit=RateLimit(limit=limit, window_s=WINDOW_S),
            prune_batch=prune_batch,
        ),
        policy=RetryPolicy(base_s=0.5, max_s=60),
    )


@pytest.fixture
def clock():
    clock = FakeClock(timezone.now() + timedelta(seconds=1))
    return clock


def recipient_admit_one(*, limit: int, window_s: float, ceiling: int = 0, **claim) -> Admission:
    """One claimed row's admission as the worker's is made: admitted if its key has a slot,
    else checked again under the key's lock and deferred (or lost)."""
    request = AdmissionRequest(**claim)
    limits = RateLimitRepository()
    if limits.recipients_admit(claims=[request], limit=limit, window_s=window_s, ceiling=ceiling):
        return Admitted()
    settled = limits.recipients_defer(
        claims=[request], limit=limit, window_s=window_s, ceiling=ceiling, ahead=DEFER_AHEAD_ROWS
    )
    return settled[request.notification_id]


def rate_key(recipient: str, *, client_id, channel: str = "email") -> bytes:
    """ratelimit_key() (its file in ratelimits) of the recipient's counting form, as the window
    table stores it."""
    key = f"{channel}:{client_id}:{recipient_key(channel, recipient)}"
    return hashlib.sha256(key.encode()).digest()


def address_key(recipient: str, *, channel: str = "email") -> bytes:
    """ratelimit_key(channel, NULL, ...): the ceiling's key per address across clients."""
    return hashlib.sha256(f"{channel}:*:{recipient_key(channel, recipient)}".encode()).digest()


def window_count(recipient: str, *, channel: str = "email", client_id=None) -> int:
    """Deliveries in the recipient's window of one client, or of every client together."""
    clients = [client_id] if client_id else list(Client.objects.values_list("id", flat=True))
    keys = [rate_key(recipient, channel=channel, client_id=c) for c in clients]
    return RecipientDelivery.objects.filter(key__in=keys).count()


def window_fill(recipient: str, notification, at) -> None:
    RecipientDelivery.objects.create(
        key=rate_key(recipient, client_id=notification.client_id),
        at=at,
        notification=notification,
        claim_token=notification.id,
    )


def sent_times(recipient: str) -> list:
    return sorted(
        Notification.objects.filter(recipient=recipient, status=Status.SENT).values_list(
            "sent_at", flat=True
        )
    )


def test_one_worker_takes_critical_then_high_then_normal_then_low(clock, workers):
    client = ClientFactory()
    created = {
        priority: NotificationFactory(client=client, priority=priority, recipient=f"{p}@x.com")
        for p, priority in [("low", 3), ("normal", 2), ("critical", 0), ("high", 1)]
    }
    from tests.support.delivery_helpers import worker_build

    worker = worker_build(concurrency=1, batch_size=1)
    workers(worker)
    step_until_idle(worker)
    # The fake clock stands still, so started_at ties; attempt ids record the claim order.
    order = list(DeliveryAttempt.objects.order_by("id").values_list("notification_id", flat=True))
    expected = [
        created[p].id for p in (Priority.CRITICAL, Priority.HIGH, Priority.NORMAL, Priority.LOW)
    ]
    assert order == expected


def test_twelve_due_with_limit_ten_sends_ten_and_defers_two_to_the_exact_free_moment(
    clock, workers
):
    client = ClientFactory()
    for _ in range(12):
        NotificationFactory(client=client, recipient="ada@example.com")
    from prometheus_client import REGISTRY

    def deferrals():
        labels = {"channel": "email"}
        return REGISTRY.get_sample_value("notifyqueue_rate_limit_deferrals_total", labels) or 0

    before = deferrals()
    worker = limited_worker(clock)
    workers(worker)
    step_until_idle(worker)

    assert Notification.objects.filter(status=Status.SENT).count() == 10
    # The 11th is claimed and deferred; its deferral schedules the 12th too, which is then
    # deferred again only if it was already claimed by another delivery slot.
    deferred_count = deferrals() - before
    assert deferred_count in (1, 2)
    waiting = list(Notification.objects.filter(status=Status.PENDING).order_by("due_at"))
    assert len(waiting) == 2
    oldest = [r.at for r in RecipientDelivery.objects.order_by("at")[:2]]
    assert [n.due_at for n in waiting] == [t + timedelta(seconds=WINDOW_S) for t in oldest]
    assert {n.attempt_count for n in waiting} == {0}  # the deferral gave the attempt back
    assert {n.last_error for n in waiting} == {None}  # and recorded no failure
    deferred = DeliveryAttempt.objects.filter(outcome=Outcome.RATE_LIMITED)
    assert deferred.count() == deferred_count
    assert set(deferred.values_list("error", flat=True)) == {None}

    clock.now = waiting[0].due_at - timedelta(milliseconds=1)
    step_until_idle(worker)
    assert Notification.objects.filter(status=Status.SENT).count() == 10  # not yet
    clock.now = waiting[1].due_at
    step_until_idle(worker)
    assert Notification.objects.filter(status=Status.SENT).count() == 12


def test_the_window_rolls_instead_of_resetting(clock, workers):
    """Ten at 12:59 and ten more at 13:00 is impossible: the next ten wait a full window."""
    client = ClientFactory()
    for _ in range(10):
        NotificationFactory(client=client, recipient="ada@example.com")
    worker = limited_worker(clock)
    workers(worker)
    step_until_idle(worker)
    first_batch = sent_times("ada@example.com")
    assert len(first_batch) == 10

    clock.advance(WINDOW_S / 60)  # "one minute later", whatever a clock hour would say
    for _ in range(10):
        NotificationFactory(
            client=client, recipient="ada@example.com", send_at=clock.now, due_at=clock.now
        )
    step_until_idle(worker)
    assert len(sent_times("ada@example.com")) == 10
    clock.now = first_batch[-1] + timedelta(seconds=WINDOW_S)
    step_until_idle(worker)
    times = sent_times("ada@example.com")
    assert len(times) == 20
    for i in range(len(times) - 10):  # any 11 consecutive sends span at least a window
        assert times[i + 10] - times[i] >= timedelta(seconds=WINDOW_S)


def test_a_recipient_over_its_limit_does_not_delay_another_recipient(clock, workers):
    client = ClientFactory()
    for _ in range(30):
        NotificationFactory(client=client, recipient="busy@example.com")
    others = NotificationFactory.create_batch(5, client=client)
    worker = limited_worker(clock, batch_size=10)
    workers(worker)
    step_until_idle(worker)
    assert {n.status for n in Notification.objects.filter(id__in=[o.id for o in others])} == {
        Status.SENT
    }
    assert (
        Notification.objects.filter(recipient="busy@example.com", status=Status.SENT).count() == 10
    )


def test_critical_passes_a_full_window_and_still_counts(clock, workers):
    client = ClientFactory()
    for _ in range(10):
        NotificationFactory(client=client, recipient="ada@example.com")
    worker = limited_worker(clock)
    workers(worker)
    step_until_idle(worker)
    critical = NotificationFactory(
        client=client,
        recipient="ada@example.com",
        priority=Priority.CRITICAL,
        send_at=clock.now,
        due_at=clock.now,
    )
    normal = NotificationFactory(
        client=client, recipient="ada@example.com", send_at=clock.now, due_at=clock.now
    )
    step_until_idle(worker)
    critical.refresh_from_db()
    normal.refresh_from_db()
    assert critical.status == Status.SENT
    assert normal.status == Status.PENDING
    assert window_count("ada@example.com") == 11


def test_two_workers_racing_for_the_last_slot_send_once(clock):
    """Nine deliveries in the window, two claims for the same recipient checked at the same
    moment from two connections: exactly one is admitted, 25 times over."""
    repo = DeliveryRepository()
    client = ClientFactory()
    for round_number in range(25):
        recipient = f"race{round_number}@example.com"
        for _ in range(9):
            n = NotificationFactory(client=client, recipient=recipient, status=Status.SENT)
            window_fill(recipient, n, clock.now)
        NotificationFactory.create_batch(
            2, client=client, recipient=recipient, send_at=clock.now, due_at=clock.now
        )
        claims = repo.notification_claim_due(worker="w", limit=2, claim_timeout_s=30)
        assert len(claims) == 2

        def admit(i, barrier, claims=claims, recipient=recipient):
            barrier.wait()
            return recipient_admit_one(
                channel="email",
                client_id=client.id,
                recipient=recipient,
                notification_id=claims[i].id,
                claim_token=claims[i].claim_token,
                critical=False,
                limit=10,
                window_s=WINDOW_S,
            )

        results = run_in_threads(2, admit)
        kinds = sorted(type(r).__name__ for r in results)
        assert kinds == ["Admitted", "Deferred"], (round_number, results)
        assert window_count(recipient) == 10
        repo_rows = Notification.objects.filter(recipient=recipient, status=Status.PENDING)
        assert repo_rows.count() == 1


def test_a_failed_attempt_gives_its_slot_back(clock, workers):
    client = ClientFactory()
    NotificationFactory(client=client, recipient="permanent-failure@example.com")
    worker = limited_worker(clock)
    workers(worker)
    step_until_idle(worker)
    assert not RecipientDelivery.objects.exists()


def test_failed_attempts_let_the_rows_held_behind_them_go_at_once(clock, workers):
    """Limit 2: of four rows to one address, two are sent and two held to +60 s. Both sends
    fail for good, giving their slots back, so the two held rows go at once (and fail too)
    instead of a minute later: the finish answers which slots were freed, and the worker lets
    the next held row of each such key go (`ratelimit_release_freed`)."""
    client = ClientFactory()
    rows = [
        NotificationFactory(client=client, recipient="permanent-failure@example.com")
        for _ in range(4)
    ]
    worker = limited_worker(clock, limit=2)
    workers(worker)
    step_until_idle(worker)
    statuses = Notification.objects.filter(id__in=[n.id for n in rows]).values_list(
        "status", flat=True
    )
    assert sorted(statuses) == [Status.FAILED] * 4
    assert not RecipientDelivery.objects.exists()


def test_a_lost_claim_is_not_deferred(clock):
    client = ClientFactory()
    recipient = "ada@example.com"
    for _ in range(10):
        n = NotificationFactory(client=client, recipient=recipient, status=Status.SENT)
        window_fill(recipient, n, clock.now)
    notification = NotificationFactory(client=client, recipient=recipient)
    import uuid

    result = recipient_admit_one(
        channel="email",
        client_id=client.id,
        recipient=recipient,
        notification_id=notification.id,
        claim_token=uuid.uuid4(),
        critical=False,
        limit=10,
        window_s=WINDOW_S,
    )
    assert result == ClaimLost()


def test_a_backlogged_recipient_is_not_claimed_and_deferred_over_and_over(clock, workers):
    """1,000 waiting for one recipient, limit 10: each row is deferred at most once and every
    later claim of that recipient is a send, so three windows cost about 1,000 + 30 claims'
    worth of work for the first batch and then one claim per send, not 990 per window."""
    client = ClientFactory()
    recipient = "backlog@example.com"
    notifications_insert_bulk(
        client_id=client.id,
        count=1000,
        status=Status.PENDING,
        recipient=recipient,
        start=clock.now - timedelta(seconds=2),
        attempt_count=0,
        last_error=None,
    )
    worker = limited_worker(clock, batch_size=100, concurrency=8)
    workers(worker)
    repository = DeliveryRepository()
    end = clock.now + timedelta(seconds=3 * WINDOW_S)
    while True:
        step_until_idle(worker)
        due_in = repository.notification_next_due_in()
        if due_in is None or clock.now + timedelta(seconds=due_in) >= end:
            break
        clock.advance(max(0.0, due_in))

    sent = Notification.objects.filter(recipient=recipient, status=Status.SENT).count()
    assert sent == 30  # 10 per window, three windows
    claims = DeliveryAttempt.objects.filter(notification__recipient=recipient)
    deferrals = claims.filter(outcome=Outcome.RATE_LIMITED).count()
    print(f"backlog of 1000, limit 10, 3 windows: {claims.count()} claims, {deferrals} deferrals")
    # The first batch of 100 defers 90; after that, each claim of this recipient is a send.
    assert deferrals <= 100
    assert claims.count() <= 100 + sent


def test_a_claims_admission_counts_its_own_earlier_rows_critical_included(clock):
    """One claim, one recipient, limit 3, one delivery already in the window; the claim holds
    a CRITICAL, then three NORMAL rows (claim order = id order): the CRITICAL goes and counts,
    so only the first NORMAL fits. Row by row and set-based give the same answer."""
    import uuid

    from ratelimits.repositories import AdmissionRequest

    client = ClientFactory()
    recipient = "ada@example.com"
    window_fill(recipient, NotificationFactory(client=client, recipient=recipient), clock.now)
    rows = sorted(
        NotificationFactory.create_batch(4, client=client, recipient=recipient),
        key=lambda n: n.id,
    )
    claims = [
        AdmissionRequest("email", client.id, recipient, n.id, uuid.uuid4(), critical=i == 0)
        for i, n in enumerate(rows)
    ]
    admitted = RateLimitRepository().recipients_admit(claims=claims, limit=3, window_s=WINDOW_S)
    assert admitted == {rows[0].id, rows[1].id}
    assert window_count(recipient) == 3


def test_a_window_full_of_critical_deliveries_costs_a_claim_no_more_than_its_limit(clock):
    """CRITICAL deliveries are never held back, so one recipient's window can hold any number
    of them: 2,000 here, limit 10. A claim of 50 NORMAL rows for that recipient: every count of
    the window stops at the limit (the verdict is the same for any count from there up; 500
    entries of `ratelimit_key_at` read). Counted in full, the admission read all 2,000 for each
    of the 50 rows (100,000 entries). A deferral reads the newest `limit` deliveries only (its
    `row_number() <= limit` stops the backward walk of the index)."""
    import uuid

    from django.db import connection, transaction

    from ratelimits.repositories import AdmissionRequest, Deferred
    from ratelimits.services import recipient_admit

    client = ClientFactory()
    recipient = "flooded@example.com"
    anchor = NotificationFactory(client=client, recipient=recipient)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO ratelimit_delivery (key, at, notification_id, claim_token) "
            "SELECT %s, %s - g * interval '1 millisecond', %s, gen_random_uuid() "
            "FROM generate_series(1, 2000) AS g",
            [rate_key(recipient, client_id=client.id), clock.now, anchor.id],
        )
        cursor.execute("ANALYZE ratelimit_delivery")
    rows = NotificationFactory.create_batch(50, client=client, recipient=recipient)
    claims = [
        AdmissionRequest("email", client.id, recipient, n.id, uuid.uuid4(), critical=False)
        for n in rows
    ]
    repository = RateLimitRepository()

    def entries_read() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_get_xact_tuples_returned('ratelimit_key_at'::regclass)")
            return cursor.fetchone()[0]

    with transaction.atomic():  # the counters are this transaction's
        before = entries_read()
        admitted = repository.recipients_admit(claims=claims, limit=10, window_s=WINDOW_S)
        admission = entries_read() - before
    assert admitted == set()
    assert admission <= len(claims) * (10 + 1), admission

    [claim] = DeliveryRepository().notification_claim_due(worker="w", limit=1, claim_timeout_s=30)
    with transaction.atomic():
        before = entries_read()
        admission = recipient_admit(
            claim, rate_limit=RateLimit(10, WINDOW_S), repository=repository
        )
        deferral = entries_read() - before
    assert isinstance(admission, Deferred)
    assert deferral <= 3 * (10 + 1), deferral


def test_a_claims_admission_counts_each_key_without_reading_the_whole_window(clock):
    """The window table was small when PL/pgSQL made its first plans; then it fills with
    20,000 deliveries of other recipients (no ANALYZE yet). The admission still counts each
    key of the claim through ratelimit_key_at: a plan that scanned the window table made
    every claim cost more the more was sent lately. (Planned on every call, it still did once
    in a full run, from statistics earlier tests left: sequential scans are off for the
    function, ratelimits 0011.)"""
    import uuid

    from django.db import connection, transaction

    from ratelimits.repositories import AdmissionRequest

    client = ClientFactory()
    repository = RateLimitRepository()

    def admit(count: int) -> set:
        rows = NotificationFactory.create_batch(count, client=client)
        claims = [
            AdmissionRequest("email", client.id, n.recipient, n.id, uuid.uuid4(), False)
            for n in rows
        ]
        admitted = repository.recipients_admit(claims=claims, limit=10, window_s=WINDOW_S)
        assert admitted == {n.id for n in rows}
        return admitted

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE ratelimit_delivery")  # small: a few rows at most
    for _ in range(8):  # past PL/pgSQL's five custom plans: the kept plan is made now
        admit(1)
    anchor = NotificationFactory(client=client)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO ratelimit_delivery (key, at, notification_id, claim_token) "
            "SELECT sha256(('other-' || g)::bytea), %s, %s, gen_random_uuid() "
            "FROM generate_series(1, 20000) AS g",
            [clock.now, anchor.id],
        )

    def rows_read_by_sequential_scans() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_stat_get_xact_tuples_returned('ratelimit_delivery'::regclass)"
            )
            return cursor.fetchone()[0]

    with transaction.atomic():  # the counter is this transaction's
        before = rows_read_by_sequential_scans()
        admit(50)
        after = rows_read_by_sequential_scans()

    assert after - before < 1000, (before, after)


@pytest.mark.parametrize(("limit", "released"), [(3, True), (2, False)])
def test_a_slot_left_after_a_claims_admission_lets_the_next_held_row_go(clock, limit, released):
    """One delivery in the window, one row held back by an earlier deferral, one claimed row:
    with a limit of 3 a slot is still free after the claim, so the held row is due now; with 2
    the claim took the last slot and the held row keeps waiting. A held row of a recipient the
    claim does not touch keeps waiting either way."""
    import uuid

    from ratelimits.repositories import AdmissionRequest

    client = ClientFactory()
    recipient = "ada@example.com"
    window_fill(recipient, NotificationFactory(client=client, recipient=recipient), clock.now)
    hold = {
        "status": Status.PENDING,
        "due_at": clock.now + timedelta(seconds=50),
        "rate_deferred_from": clock.now - timedelta(seconds=5),
    }
    held = NotificationFactory(client=client, recipient=recipient, **hold)
    held_elsewhere = NotificationFactory(client=client, recipient="bob@example.com", **hold)
    claimed = NotificationFactory(client=client, recipient=recipient)

    admitted = RateLimitRepository().recipients_admit(
        claims=[AdmissionRequest("email", client.id, recipient, claimed.id, uuid.uuid4(), False)],
        limit=limit,
        window_s=WINDOW_S,
    )

    assert admitted == {claimed.id}
    held.refresh_from_db()
    held_elsewhere.refresh_from_db()
    if released:
        assert (held.due_at, held.rate_deferred_from) == (clock.now, None)
    else:
        assert (held.due_at, held.rate_deferred_from) == (
            hold["due_at"],
            hold["rate_deferred_from"],
        )
    assert held_elsewhere.rate_deferred_from == hold["rate_deferred_from"]


def test_two_claims_admitting_the_same_keys_in_opposite_orders_never_deadlock(clock):
    """Two workers admit claims that share 40 recipients, listed in opposite orders, 10 times
    at the same moment: the keys are locked in one global order, so no statement fails with
    a deadlock, and no recipient gets more than its limit."""
    import uuid

    from ratelimits.repositories import AdmissionRequest

    client = ClientFactory()
    recipients = [f"both{i}@example.com" for i in range(40)]
    limits = RateLimitRepository()
    for _ in range(10):
        claims = [
            [
                AdmissionRequest("email", client.id, r, n.id, uuid.uuid4(), critical=False)
                for r in recipients
                for n in [NotificationFactory(client=client, recipient=r)]
            ]
            for _ in range(2)
        ]
        claims[1].reverse()

        def admit(i, barrier, claims=claims):
            barrier.wait()
            return limits.recipients_admit(claims=claims[i], limit=3, window_s=WINDOW_S)

        run_in_threads(2, admit)  # a deadlock would raise here
    assert max(window_count(r) for r in recipients) == 3


@pytest.mark.django_db
def test_an_admission_counts_a_keys_window_again_only_when_the_key_has_a_held_row(clock):
    """After admitting a claim, a key with a slot left lets its next held row go; only a key
    with a held row needs its window counted for that. With none held, each key's window is
    read once, by the admission itself (ratelimits 0010: the planner had run the release's
    count for every key before the probe for held rows)."""
    import uuid

    from django.db import connection, transaction

    from ratelimits.repositories import AdmissionRequest

    client = ClientFactory()
    rows = NotificationFactory.create_batch(20, client=client)
    claims = [
        AdmissionRequest("email", client.id, n.recipient, n.id, uuid.uuid4(), False) for n in rows
    ]
    with connection.cursor() as cursor:
        # Five deliveries in each key's window already, under the limit of 10, among 20,000
        # of other recipients: the planner counts a key through ratelimit_key_at.
        cursor.execute(
            "INSERT INTO ratelimit_delivery (key, at, notification_id, claim_token) "
            "SELECT ratelimit_key('email', %s, r), %s, %s, gen_random_uuid() "
            "FROM unnest(%s::text[]) AS r, generate_series(1, 5)",
            [client.id, clock.now - timedelta(seconds=1), rows[0].id, [n.recipient for n in rows]],
        )
        cursor.execute(
            "INSERT INTO ratelimit_delivery (key, at, notification_id, claim_token) "
            "SELECT sha256(('other-' || g)::bytea), %s, %s, gen_random_uuid() "
            "FROM generate_series(1, 20000) AS g",
            [clock.now - timedelta(seconds=1), rows[0].id],
        )
        cursor.execute("ANALYZE ratelimit_delivery")

    def window_entries_read() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_get_xact_tuples_returned('ratelimit_key_at'::regclass)")
            return cursor.fetchone()[0]

    with transaction.atomic():  # the counter is this transaction's
        before = window_entries_read()
        admitted = RateLimitRepository().recipients_admit(
            claims=claims, limit=10, window_s=WINDOW_S
        )
        read = window_entries_read() - before

    assert admitted == {n.id for n in rows}
    # The admission's count reads each key's 5 entries; a second count per key read 6 more.
    assert read == 5 * len(rows)


@pytest.mark.django_db
def test_the_admissions_kept_plan_reads_each_keys_window_through_its_own_index(clock):
    """The admission's plans are kept for the connection (ratelimits 0014), made from the
    statistics of that moment. Here those say the window table holds one recipient's 20,000
    deliveries: a plan that trusted them found the key useless for narrowing and read the
    window through ratelimit_at (every delivery in the window, of every recipient; migration
    0010 withdrew the kept plans for it). Later claims for other recipients, each with five
    deliveries in its window and five older, read exactly those through ratelimit_key_at."""
    import uuid

    from django.db import connection, transaction

    from ratelimits.repositories import AdmissionRequest

    client = ClientFactory()
    repository = RateLimitRepository()
    busy = NotificationFactory(client=client)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO ratelimit_delivery (key, at, notification_id, claim_token) "
            "SELECT ratelimit_key('email', %s, %s), %s - g * interval '1 ms', %s, "
            "gen_random_uuid() FROM generate_series(1, 20000) AS g",
            [client.id, busy.recipient, clock.now, busy.id],
        )
        cursor.execute("ANALYZE ratelimit_delivery")

    def claims(count: int) -> list[AdmissionRequest]:
        return [
            AdmissionRequest("email", client.id, n.recipient, n.id, uuid.uuid4(), False)
            for n in NotificationFactory.create_batch(count, client=client)
        ]

    for _ in range(3):  # the kept plan is made at the first call, from those statistics
        repository.recipients_admit(claims=claims(1), limit=10, window_s=WINDOW_S)
    later = claims(20)
    with connection.cursor() as cursor:
        for ago in (1, WINDOW_S + 1):  # five in each key's window, five older
            cursor.execute(
                "INSERT INTO ratelimit_delivery (key, at, notification_id, claim_token) "
                "SELECT ratelimit_key('email', %s, r), %s, %s, gen_random_uuid() "
                "FROM unnest(%s::text[]) AS r, generate_series(1, 5)",
                [
                    client.id,
                    clock.now - timedelta(seconds=ago),
                    busy.id,
                    [c.recipient for c in later],
                ],
            )

    def entries_read(index: str) -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_get_xact_tuples_returned(%s::regclass)", [index])
            return cursor.fetchone()[0]

    indexes = ("ratelimit_at", "ratelimit_key_at", "ratelimit_address_key_at")
    with transaction.atomic():  # the counters are this transaction's
        before = {i: entries_read(i) for i in indexes}
        admitted = repository.recipients_admit(claims=later, limit=10, window_s=WINDOW_S)
        read = {i: entries_read(i) - before[i] for i in before}

    assert admitted == {c.notification_id for c in later}
    # Per key: the five older deliveries, forgotten, and the five in the window, counted; the
    # ceiling is off, so its index is never opened.
    assert read == {
        "ratelimit_at": 0,
        "ratelimit_key_at": 10 * len(later),
        "ratelimit_address_key_at": 0,
    }, read


def test_a_deferral_reads_the_recipients_backlog_not_its_history():
    """A deferral schedules the recipient's waiting rows. Found among every row the recipient
    ever had, through the record's recipient index, a recipient at its limit with a long
    history (a monitoring inbox, one push token) would make every deferral read all of it, in
    the worker's loop under the key's lock. The head of the client's due range and the held
    rows' index are all it reads: the pages it visits do not grow with the 5,000 delivered
    rows here."""
    import uuid

    from django.db import connection, transaction

    from notifyqueue.sqlfile import queries_load
    from ratelimits.repositories import SQL

    client = ClientFactory()
    recipient = "inbox@example.com"
    notifications_insert_bulk(
        client_id=client.id,
        count=5000,
        status=Status.SENT,
        attempt_count=1,
        last_error=None,
        recipient=recipient,
    )
    waiting = NotificationFactory.create_batch(3, client=client, recipient=recipient)
    claimed = NotificationFactory(client=client, recipient=recipient)
    token = uuid.uuid4()
    Notification.objects.filter(id=claimed.id).update(
        status=Status.PROCESSING,
        claim_token=token,
        claimed_by="worker-1",
        claim_expires_at=timezone.now() + timedelta(minutes=5),
        attempt_count=1,
    )
    sent = NotificationFactory.create_batch(2, client=client, recipient=recipient, status="SENT")
    for row in sent:  # the window full: the rows go a window and more ahead
        window_fill(recipient, row, timezone.now())
    statement = queries_load(SQL.path)["ratelimit_defer_many"]
    params = {
        "channels": ["email"],
        "client_ids": [client.id],
        "recipients": [recipient],
        "recipient_keys": [recipient],
        "ids": [claimed.id],
        "claim_tokens": [token],
        "limit": 2,
        "ceiling": 0,
        "window_s": WINDOW_S,
        "ahead": DEFER_AHEAD_ROWS,
    }
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE notification")
        cursor.execute("ANALYZE notification_queue")
    with transaction.atomic(), connection.cursor() as cursor:
        before = pages_visited_by_relation()
        cursor.execute(statement, params)
        after = pages_visited_by_relation()
        cursor.execute(
            "SELECT id FROM notification WHERE status = 'PENDING' AND due_at > notifyqueue_now()"
        )
        scheduled = {row_id for (row_id,) in cursor.fetchall()}
        transaction.set_rollback(True)

    # It did its work: the claimed row and the three waiting ones all have a slot ahead.
    assert scheduled == {claimed.id, *(n.id for n in waiting)}
    # The pages of the record and of its recipient index it visited, its triggers' included:
    # 40 here. A walk of the recipient's rows through that index reads every page holding one
    # of them, hundreds for the 5,000 delivered here, and more as the history grows.
    visited = {name: after[name] - before.get(name, 0) for name in after}
    history = visited["notification"] + visited["notification_recipient"]
    assert history < 100, visited


def test_the_prune_forgets_deliveries_that_left_every_window_a_batch_at_a_time(clock):
    """The worker's upkeep deletes window rows older than the window, at most `limit` a call
    (rows named by their claim token, the table's key); rows still inside it stay."""
    import uuid

    notification = NotificationFactory()
    now = timezone.now()

    def delivery(age_s: float) -> RecipientDelivery:
        return RecipientDelivery(
            key=rate_key("ada@example.com", client_id=notification.client_id),
            at=now - timedelta(seconds=age_s),
            notification=notification,
            claim_token=uuid.uuid4(),
        )

    RecipientDelivery.objects.bulk_create(
        [delivery(WINDOW_S + 30) for _ in range(5)] + [delivery(WINDOW_S - 30) for _ in range(3)]
    )
    repository = RateLimitRepository()

    assert repository.ratelimit_prune(window_s=WINDOW_S, limit=4) == 4
    assert repository.ratelimit_prune(window_s=WINDOW_S, limit=4) == 1
    assert repository.ratelimit_prune(window_s=WINDOW_S, limit=4) == 0
    assert RecipientDelivery.objects.count() == 3
    assert not RecipientDelivery.objects.filter(at__lte=now - timedelta(seconds=WINDOW_S))


def test_the_workers_prune_keeps_pace_with_what_it_admitted(clock, workers):
    """Rows leave the window at the rate they were admitted a window ago. One prune statement
    a heartbeat (10,000 rows a worker every 5 s) fell behind above 2,000 deliveries a second a
    worker, and the expired rows piled up for as long as the rate lasted. The loop now also
    prunes a batch per batch of deliveries it admitted: here batches of 100, 300 deliveries,
    so at least 300 of the 1,000 expired rows go (200 did: one at the start, one at the end)."""
    client = ClientFactory()
    expired = NotificationFactory(client=client, status=Status.SENT)
    RecipientDelivery.objects.bulk_create(
        RecipientDelivery(
            key=rate_key(f"gone-{n}@example.com", client_id=client.id),
            at=clock.now - timedelta(seconds=WINDOW_S + 10),
            notification=expired,
            claim_token=uuid.uuid4(),
        )
        for n in range(1000)
    )
    notifications_insert_bulk(client_id=client.id, count=300, status=Status.PENDING)
    worker = limited_worker(clock, prune_batch=100)
    workers(worker)

    worker.run(until_empty=True)

    assert Notification.objects.filter(status=Status.SENT).count() == 301
    window_start = clock.now - timedelta(seconds=WINDOW_S)
    assert RecipientDelivery.objects.filter(at__lte=window_start).count() <= 1000 - 300
    assert RecipientDelivery.objects.filter(at__gt=window_start).count() == 300  # kept


def test_a_deferral_schedules_the_waiting_rows_behind_another_workers_claim(clock):
    """Limit 1, its slot taken: A is claimed and deferred while B, created after it, is held
    by another worker's claim not yet admitted, and C waits. A's deferral gives A and C the
    next two slots; B's, when its worker finds the key full, continues from the last slot
    handed out, so B takes the third, not one of theirs, where it would only be claimed and
    deferred again: each row is deferred once."""
    client = ClientFactory()
    recipient = "ada@example.com"
    window_fill(recipient, NotificationFactory(client=client, status=Status.SENT), clock.now)
    a, b, c = (NotificationFactory(client=client, recipient=recipient) for _ in range(3))
    for offset, row in enumerate((a, b, c)):
        Notification.objects.filter(id=row.id).update(
            created_at=clock.now - timedelta(seconds=30 - offset)
        )
    tokens = {a.id: uuid.uuid4(), b.id: uuid.uuid4()}
    for row_id, token in tokens.items():
        Notification.objects.filter(id=row_id).update(
            status=Status.PROCESSING,
            claim_token=token,
            claimed_by="worker-1" if row_id == a.id else "worker-2",
            claim_expires_at=clock.now + timedelta(minutes=5),
            attempt_count=1,
        )

    deferred = recipient_admit_one(
        channel="email",
        client_id=client.id,
        recipient=recipient,
        notification_id=a.id,
        claim_token=tokens[a.id],
        critical=False,
        limit=1,
        window_s=WINDOW_S,
    )

    window = timedelta(seconds=WINDOW_S)
    assert deferred.due_at == clock.now + window  # A: the first free slot
    c.refresh_from_db()
    assert c.due_at == clock.now + 2 * window  # C: the second

    deferred = recipient_admit_one(
        channel="email",
        client_id=client.id,
        recipient=recipient,
        notification_id=b.id,
        claim_token=tokens[b.id],
        critical=False,
        limit=1,
        window_s=WINDOW_S,
    )
    assert deferred.due_at == clock.now + 3 * window  # B: the third
