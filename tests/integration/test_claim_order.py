"""The claim order (`notification_claim_due_many`): every due CRITICAL first, whoever's; then the
clients with due rows take turns across claims of any size, the one served longest ago first;
each client's own rows go in priority order, a NORMAL or LOW row moving up one level (never
above HIGH) for each aging period it has waited past its due time."""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

from delivery.checks import priority_aging_check
from delivery.models import ClientTurn
from delivery.providers.http import HttpProvider
from delivery.providers.in_app import InAppProvider
from delivery.repositories import DeliveryRepository
from notifications.models import Notification, Status
from notifyqueue.vocabulary import Priority
from tests.support.clock import DbClock
from tests.support.delivery_helpers import worker_build
from tests.support.factories import ClientFactory, NotificationFactory
from tests.support.http_servers import ScriptedProvider
from tests.support.operator_helpers import notifications_insert_bulk
from tests.support.races import run_in_threads
from tests.support.reads import pages_visited, vacuum_after_every_snapshot

repo = DeliveryRepository()
CRITICAL, HIGH, NORMAL, LOW = Priority.CRITICAL, Priority.HIGH, Priority.NORMAL, Priority.LOW


def clients(count: int) -> list:
    """`count` clients in the order of their ids: the first is the one a claim that restarted
    its turns at every call would always serve."""
    return sorted((ClientFactory() for _ in range(count)), key=lambda c: str(c.id))


def rows(client, count: int, *, priority: int = NORMAL, due_at=None, step_s: float = 1.0):
    """`count` rows of `client`, due `step_s` apart from `due_at` (default: an hour ago)."""
    start = due_at or timezone.now() - timedelta(hours=1)
    return [
        NotificationFactory(
            client=client, priority=priority, due_at=start + timedelta(seconds=i * step_s)
        )
        for i in range(count)
    ]


def claim(limit: int, *, aging_s: float = 0.0, held: dict | None = None) -> list:
    return repo.notification_claim_due(
        worker="w", limit=limit, claim_timeout_s=30, aging_s=aging_s, held=held
    )


def claimed_ids(limit: int, *, aging_s: float = 0.0) -> list:
    """The ids a claim would take now, in claim order, without taking them (rolled back)."""
    with transaction.atomic():
        ids = [c.id for c in claim(limit, aging_s=aging_s)]
        transaction.set_rollback(True)
    return ids


def owners(claims) -> list:
    return [c.client_id for c in claims]


@pytest.mark.django_db
def test_one_row_claims_take_the_clients_in_turn_across_claims():
    """Claims sized to free send slots are mostly of one row. Each goes to the client served
    longest ago, so three clients with due rows are served a, b, c, a, b, c, ... however much
    more a has waiting (a claim that restarted its turns each time served a every time)."""
    a, b, c = clients(3)
    rows(a, 20)
    rows(b, 3, due_at=timezone.now() - timedelta(minutes=5))
    rows(c, 3, due_at=timezone.now() - timedelta(minutes=1))
    served = [owners(claim(1)) for _ in range(9)]
    assert served == [[a.id], [b.id], [c.id]] * 3
    assert owners(claim(1)) == [a.id]  # b and c have nothing left


@pytest.mark.django_db
def test_the_turns_carry_over_between_claims_of_any_size():
    a, b, c = clients(3)
    for client in (a, b, c):
        rows(client, 10)
    assert owners(claim(2)) == [a.id, b.id]
    assert owners(claim(1)) == [c.id]
    assert owners(claim(4)) == [a.id, b.id, c.id, a.id]
    assert owners(claim(1)) == [b.id]
    # A client new to the turns goes before those already served.
    [d] = clients(1)
    rows(d, 2)
    assert owners(claim(1)) == [d.id]
    assert owners(claim(3)) == [c.id, a.id, b.id]


@pytest.mark.django_db
def test_a_client_holding_the_workers_slots_waits_until_the_others_hold_as_many():
    """The worker tells the claim what it holds per client (running or waiting for a send
    slot). Holding four for a, it gives its one-row claims to b and c until each holds four
    too; then the three take turns again."""
    a, b, c = clients(3)
    for client in (a, b, c):
        rows(client, 10)
    held = Counter({a.id: 4})
    served = []
    for _ in range(11):
        [got] = claim(1, held=dict(held))
        held[got.client_id] += 1
        served.append(got.client_id)
    assert served[:8] == [b.id, c.id] * 4
    assert served[8:] == [a.id, b.id, c.id]
    # A larger claim is shared to a common level: a holds two more than b and c, so b and c
    # take the claim of four between them (each read up to its share), and a nothing.
    held = {a.id: 7, b.id: 5, c.id: 5}
    assert sorted(owners(claim(4, held=held)), key=str) == sorted([b.id, b.id, c.id, c.id], key=str)


@pytest.mark.django_db
def test_one_clients_high_flood_does_not_hold_another_clients_normal_rows():
    """Priority orders a client's own rows only: a's 30 HIGH rows and b's NORMAL rows take
    turns, and b's own HIGH row still goes before b's NORMAL ones."""
    a, b = clients(2)
    rows(a, 30, priority=HIGH)
    b_normal = rows(b, 4, priority=NORMAL, due_at=timezone.now() - timedelta(minutes=30))
    b_high = rows(b, 1, priority=HIGH, due_at=timezone.now() - timedelta(minutes=1))
    served = [claim(1)[0] for _ in range(6)]
    assert owners(served) == [a.id, b.id] * 3
    assert [c.id for c in served if c.client_id == b.id] == [
        b_high[0].id,
        *[n.id for n in b_normal[:2]],
    ]
    bigger = claim(10)
    assert sum(1 for c in bigger if c.client_id == b.id) == 2  # b's last two, then a's share
    assert len(bigger) == 7  # 5 of a (its share), b's 2; the next claim makes it up


@pytest.mark.django_db
def test_critical_goes_first_for_everyone_and_the_critical_clients_take_turns():
    a, b, c = clients(3)
    a_critical = rows(a, 3, priority=CRITICAL)
    rows(b, 5, priority=HIGH, due_at=timezone.now() - timedelta(hours=2))
    c_critical = rows(c, 2, priority=CRITICAL, due_at=timezone.now() - timedelta(minutes=1))
    first = claim(4)
    assert [n.id for n in first] == [
        a_critical[0].id,
        c_critical[0].id,
        a_critical[1].id,
        c_critical[1].id,
    ]
    second = claim(3)
    assert [n.priority for n in second] == [CRITICAL, HIGH, HIGH]
    assert second[0].id == a_critical[2].id


@pytest.mark.django_db
@pytest.mark.parametrize("aging_s", [0.0, 300.0], ids=["aging off", "aging on, none overdue"])
def test_a_single_clients_rows_go_in_strict_priority_order(aging_s):
    """One client sees strict priority, then due time, then age; aging changes nothing while
    no row has waited a period past its due time."""
    now = timezone.now()
    [client] = clients(1)
    low = rows(client, 1, priority=LOW, due_at=now - timedelta(seconds=200))
    normal = rows(client, 2, priority=NORMAL, due_at=now - timedelta(seconds=100))
    high = rows(client, 2, priority=HIGH, due_at=now - timedelta(seconds=10))
    critical = rows(client, 1, priority=CRITICAL, due_at=now)
    DbClock(now)
    expected = [n.id for n in (*critical, *high, *normal, *low)]
    assert claimed_ids(10, aging_s=aging_s) == expected
    # One row at a time, the same order.
    assert [claim(1, aging_s=aging_s)[0].id for _ in expected] == expected


@pytest.mark.django_db
def test_aging_moves_a_waiting_low_row_up_one_level_per_period_never_above_high():
    """Period 100 s. A LOW row due at t0 stands with the NORMAL rows from t0 + 100 s and with
    the HIGH rows from t0 + 200 s, each time as if it had become due at that level then; it
    never passes a CRITICAL, and with aging off it stays last."""
    t0 = timezone.now() - timedelta(hours=1)
    [client] = clients(1)

    def at(seconds: float):
        return t0 + timedelta(seconds=seconds)

    [low] = rows(client, 1, priority=LOW, due_at=at(0))
    [normal_a] = rows(client, 1, priority=NORMAL, due_at=at(50))
    [normal_b] = rows(client, 1, priority=NORMAL, due_at=at(130))
    [high_a] = rows(client, 1, priority=HIGH, due_at=at(160))
    [high_b] = rows(client, 1, priority=HIGH, due_at=at(260))
    clock = DbClock(at(99))
    # Not yet a period overdue: strict priority.
    assert claimed_ids(10, aging_s=100) == [normal_a.id, low.id]

    clock.now = at(140)  # LOW is NORMAL as of 100: ahead of the NORMAL due at 130
    assert claimed_ids(10, aging_s=100) == [normal_a.id, low.id, normal_b.id]

    clock.now = at(210)  # LOW is HIGH as of 200, the NORMAL due at 50 as of 150
    assert claimed_ids(10, aging_s=100) == [normal_a.id, high_a.id, low.id, normal_b.id]

    clock.now = at(270)  # the NORMAL due at 130 is HIGH as of 230
    assert claimed_ids(10, aging_s=100) == [
        normal_a.id,
        high_a.id,
        low.id,
        normal_b.id,
        high_b.id,
    ]

    clock.now = at(10_000)  # a hundred periods: HIGH, never CRITICAL
    [critical] = rows(client, 1, priority=CRITICAL, due_at=at(9_999))
    assert claimed_ids(10, aging_s=100) == [
        critical.id,
        normal_a.id,
        high_a.id,
        low.id,
        normal_b.id,
        high_b.id,
    ]

    # Aging off: strict priority however long the rows have waited.
    assert claimed_ids(10, aging_s=0) == [
        critical.id,
        high_a.id,
        high_b.id,
        normal_a.id,
        normal_b.id,
        low.id,
    ]


@pytest.mark.django_db
@pytest.mark.parametrize("aging_s", [math.nan, math.inf, -1.0])
def test_a_period_that_is_not_a_finite_positive_number_ages_nothing_in_the_claim(aging_s):
    """The settings check refuses these; the claim itself still orders strictly by priority
    rather than failing or aging everything."""
    now = timezone.now()
    [client] = clients(1)
    [low] = rows(client, 1, priority=LOW, due_at=now - timedelta(days=3650))
    [high] = rows(client, 1, priority=HIGH, due_at=now)
    DbClock(now)
    assert claimed_ids(10, aging_s=aging_s) == [high.id, low.id]


@pytest.mark.parametrize(
    "aging_s, ok",
    [(0.0, True), (300.0, True), (0.5, True), (-1.0, False), (math.nan, False), (math.inf, False)],
)
def test_the_settings_check_accepts_only_zero_or_a_finite_positive_period(aging_s, ok):
    with override_settings(NOTIFYQUEUE_PRIORITY_AGING_SECONDS=aging_s):
        errors = priority_aging_check(None)
    assert (errors == []) is ok, errors
    if not ok:
        assert errors[0].id == "delivery.E003"
        assert "NOTIFYQUEUE_PRIORITY_AGING_SECONDS" in errors[0].msg


@pytest.mark.django_db(transaction=True)
def test_racing_workers_get_disjoint_claims_and_never_wait_on_the_turns():
    """Eight connections claim two rows at a time from five clients, each with rows of every
    priority, aging on, until nothing is left: every row is claimed exactly once, no claim
    fails (a deadlock on the turn markers would), and every client served has a marker."""
    served = clients(5)
    created = []
    for n, client in enumerate(served):
        for priority in (CRITICAL, HIGH, NORMAL, LOW):
            created += rows(client, 6, priority=priority, step_s=n + 1)

    def drain(i, barrier):
        barrier.wait()
        got = []
        # A claim can come back empty while another holds the last rows locked for a moment:
        # the thread stops only once nothing is waiting.
        while True:
            batch = repo.notification_claim_due(
                worker=f"w{i}", limit=2, claim_timeout_s=30, aging_s=60
            )
            got += [c.id for c in batch]
            if not batch and not Notification.objects.filter(status=Status.PENDING).exists():
                return got

    claimed = [i for got in run_in_threads(8, drain) for i in got]
    assert len(claimed) == len(set(claimed)) == len(created)
    assert set(claimed) == {n.id for n in created}
    assert not Notification.objects.filter(status=Status.PENDING).exists()
    assert set(ClientTurn.objects.values_list("client_id", flat=True)) == {c.id for c in served}


@pytest.mark.django_db(transaction=True)
def test_a_claim_waits_for_no_other_claims_turn_marker(database_url):
    """Another transaction holds a client's turn marker (as a claim serving it does for a
    moment): a claim serving that client does not wait for it, it leaves the marker to the
    holder."""
    import psycopg

    [a] = clients(1)
    rows(a, 4)
    claim(1)  # a's marker exists
    before = ClientTurn.objects.get(client_id=a.id)
    with psycopg.connect(database_url) as other:
        other.execute(
            "SELECT pg_advisory_xact_lock(hashtext('notifyqueue:client_turn'), hashtext(%s))",
            [str(a.id)],
        )
        other.execute("SELECT 1 FROM delivery_client_turn WHERE client_id = %s FOR UPDATE", [a.id])
        started = time.monotonic()
        assert owners(claim(1)) == [a.id]
        assert time.monotonic() - started < 2
        other.rollback()
    assert ClientTurn.objects.get(client_id=a.id).served_claim == before.served_claim
    claim(1)
    assert ClientTurn.objects.get(client_id=a.id).served_claim > before.served_claim


@pytest.mark.django_db(transaction=True)
def test_a_claim_reads_as_much_behind_a_large_overdue_backlog_as_behind_a_small_one():
    """Three clients; one has 20,000 LOW and 20,000 HIGH rows, all overdue by many aging
    periods, so every LOW row stands at HIGH. A claim of 10 reads each client's heads, never
    the backlog: about as many pages as the same claim behind 200 rows of each."""
    tables = ("notification", "notification_queue", "delivery_attempt", "delivery_client_turn")

    def pages(backlog: int) -> int:
        Notification.objects.all().delete()
        flood, *quiet = clients(3)
        start = timezone.now() - timedelta(days=1)
        for _ in (LOW, HIGH):
            notifications_insert_bulk(
                client_id=flood.id, count=backlog, status="PENDING", start=start
            )
            with connection.cursor() as cursor:
                cursor.execute(
                    "UPDATE notification SET priority = %s WHERE client_id = %s AND priority = 2",
                    [LOW if _ == LOW else HIGH, flood.id],
                )
        for client in quiet:
            rows(client, 5)
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE notification")
        # The priorities set above left dead entries in the queue's index, which the worker's
        # upkeep vacuums away in production (delivery/upkeep.py).
        vacuum_after_every_snapshot("notification_queue", analyze=True)
        claim(1, aging_s=60)  # the plan is made
        with transaction.atomic():
            before = pages_visited(tables)
            claims = claim(10, aging_s=60)
            visited = pages_visited(tables) - before
        assert len(claims) == 10
        assert {c.client_id for c in claims} == {flood.id, *(c.id for c in quiet)}
        return visited

    small, large = pages(200), pages(20_000)
    print(f"a claim of 10 visited {small} pages behind 400 rows, {large} behind 40,000")
    assert large <= small + 60, (small, large)


def http_worker(provider: ScriptedProvider, *, concurrency: int, aging_s: float = 300.0):
    http = HttpProvider(url=provider.url, timeout_s=5)
    return worker_build(
        providers={"email": http, "sms": http, "push": http, "in_app": InAppProvider()},
        concurrency=concurrency,
        batch_size=10,
        priority_aging_s=aging_s,
    )


def wait_for(predicate, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def send_order(provider: ScriptedProvider, notifications) -> list[int]:
    """Where each of `notifications` came in the provider's sends (0 first)."""
    order = [call.key.split(":")[0] for call in sorted(provider.sends.values(), key=lambda c: c.at)]
    return sorted(order.index(str(n.id)) for n in notifications)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("concurrency", [1, 2])
@pytest.mark.parametrize("flood_priority", [NORMAL, HIGH], ids=["NORMAL flood", "HIGH flood"])
def test_a_real_worker_on_a_slow_provider_serves_a_quiet_client_in_turn_behind_a_flood(
    concurrency, flood_priority
):
    """A worker with one or two send slots, a provider that takes 50 ms a call: each claim is
    of one row or two. The flooding client's 30 rows (NORMAL, or HIGH) were created first and
    its id sorts first; the quiet client's 4 NORMAL rows still go out within the first dozen
    sends, every other one, not after the flood."""
    flooder, quiet = clients(2)
    flood = rows(flooder, 30, priority=flood_priority)
    waiting = rows(quiet, 4, priority=NORMAL, due_at=timezone.now() - timedelta(minutes=1))
    with ScriptedProvider(delay_s=0.05) as provider:
        http_worker(provider, concurrency=concurrency).run(until_empty=True)
    assert len(provider.sends) == len(flood) + len(waiting)
    places = send_order(provider, waiting)
    assert places[-1] <= 2 * len(waiting) + concurrency + 2, places
    assert set(Notification.objects.values_list("status", flat=True)) == {Status.SENT}


@pytest.mark.django_db(transaction=True)
def test_a_real_worker_on_a_slow_provider_holds_one_claim_ready_so_a_late_client_goes_next():
    """A provider taking 0.5 s a call and 4 send slots, a flood of one client's rows. Until a
    call has been timed the worker holds half its slots again in claims ready (2); then one,
    as many as slots free while its loop turns once (4 x a turn of some ms / 0.5 s), so the
    worker holds at most 5 claims, not 6. A client whose rows arrive while the flood fills
    every slot then waits behind that one claim, then takes turns with the flood."""
    flooder, late = clients(2)
    rows(flooder, 40)
    with ScriptedProvider(delay_s=0.5) as provider:
        worker = http_worker(provider, concurrency=4)
        assert worker._sends.ready == 2

        def run() -> None:
            try:
                worker.run()
            finally:
                connection.close()

        runner = threading.Thread(target=run)
        runner.start()
        try:
            wait_for(lambda: len(provider.calls) >= 10, "two rounds of calls, timed")
            held = []
            for _ in range(20):
                held.append(worker._sends.outstanding)
                time.sleep(0.025)
            assert worker._sends.ready == 1
            assert max(held) <= 4 + 1, held
            made = time.time()
            before = len(provider.calls)
            waiting = rows(late, 4, due_at=timezone.now() - timedelta(seconds=1), step_s=0.01)
            keys = {f"{n.id}:email" for n in waiting}
            wait_for(lambda: keys <= {c.key for c in provider.calls}, "the late rows sent")
        finally:
            worker.stop()
            runner.join(30)
    after = provider.calls[before:]
    order = "".join("L" if c.key in keys else "f" for c in after)
    # Turns, one row each, behind at most the claim held ready and one claimed as the rows
    # were created: the late client's 4 within the next 2 x 4 + 2 calls.
    assert order.rindex("L") < 2 * 4 + 2, order
    # Each waited at most for the next slot to free (one call) and its share of the turns.
    assert max(c.at for c in after if c.key in keys) - made < 2 * 0.5 + 0.3, order
    assert Notification.objects.filter(status=Status.SENT).count() >= 4


@pytest.mark.django_db(transaction=True)
def test_a_real_worker_sends_a_long_waiting_low_row_once_aging_lifts_it():
    """One client, a worker with one slot, aging period 1 s: a LOW row overdue by three
    periods stands at HIGH as of two periods past its due time, ahead of the HIGH rows due
    after that; with aging off it is the last one sent."""
    [client] = clients(1)
    now = timezone.now()
    DbClock(now)
    for aging_s, expected in ((1.0, 2), (0.0, 12)):
        Notification.objects.all().delete()
        [low] = rows(client, 1, priority=LOW, due_at=now - timedelta(seconds=3))
        rows(client, 2, priority=HIGH, due_at=now - timedelta(seconds=2.5))
        rows(client, 10, priority=HIGH, due_at=now - timedelta(seconds=0.5), step_s=0.01)
        with ScriptedProvider(delay_s=0.01) as provider:
            http_worker(provider, concurrency=1, aging_s=aging_s).run(until_empty=True)
        assert send_order(provider, [low]) == [expected], aging_s


@pytest.mark.django_db
def test_a_claim_of_another_clients_rows_leaves_an_unknown_clients_marker_alone():
    """Markers are written only for the clients a claim served."""
    a, b = clients(2)
    rows(a, 2)
    rows(b, 1, due_at=timezone.now() + timedelta(hours=1))  # waiting, not due
    claim(1)
    assert list(ClientTurn.objects.values_list("client_id", flat=True)) == [a.id]
