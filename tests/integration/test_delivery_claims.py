"""The claim and finish statements on real PostgreSQL, raced from separate connections."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import psycopg
import pytest
from django.db import connection, transaction
from django.utils import timezone

from delivery.models import DeliveryAttempt, Outcome
from delivery.repositories import Claim, DeliveryRepository, Finish
from notifications.models import Notification, Status
from ratelimits.repositories import AdmissionRequest, RateLimitRepository
from tests.support.clock import DbClock
from tests.support.factories import ClientFactory, NotificationFactory
from tests.support.operator_helpers import notifications_insert_bulk
from tests.support.races import run_in_threads
from tests.support.reads import (
    history_read_whole,
    pages_visited,
    pages_visited_by_relation,
    planning_pages_of_partitions,
    vacuum_after_every_snapshot,
)

repo = DeliveryRepository()


@pytest.mark.django_db(transaction=True)
def test_exactly_one_of_ten_workers_claims_a_single_notification():
    client = ClientFactory()
    for _ in range(25):
        notification = NotificationFactory(client=client)

        def claim(i, barrier):
            barrier.wait()
            return repo.notification_claim_due(worker=f"w{i}", limit=1, claim_timeout_s=30)

        claims = [c for batch in run_in_threads(10, claim) for c in batch]
        assert [c.id for c in claims] == [notification.id]
        notification.refresh_from_db()
        assert notification.status == Status.PROCESSING
        assert notification.claim_token == claims[0].claim_token
        assert notification.attempt_count == 1


@pytest.mark.django_db(transaction=True)
def test_control_without_the_lock_two_workers_claim_the_same_row():
    """The race the claim prevents is real: read-then-update hands one row to every reader."""
    notification = NotificationFactory()

    def claim_without_lock(i, barrier):
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT id FROM notification WHERE status = 'PENDING' AND due_at <= now() "
                "ORDER BY priority, due_at, created_at LIMIT 1"
            )
            row = cursor.fetchone()
            barrier.wait()  # every worker has read before any writes
            cursor.execute(
                "UPDATE notification SET status = 'PROCESSING', claim_token = %s, "
                "claimed_by = %s, claim_expires_at = now() WHERE id = %s",
                [uuid.uuid4(), f"w{i}", row[0]],
            )
            return cursor.rowcount

    assert sum(run_in_threads(10, claim_without_lock)) == 10

    # The same interleaving with FOR UPDATE SKIP LOCKED hands the row to one worker only.
    Notification.objects.filter(id=notification.id).update(
        status=Status.PENDING, claim_token=None, claimed_by=None, claim_expires_at=None
    )

    def claim_with_lock(i, barrier):
        from django.db import transaction

        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "SELECT id FROM notification WHERE status = 'PENDING' AND due_at <= now() "
                "ORDER BY priority, due_at, created_at LIMIT 1 FOR UPDATE SKIP LOCKED"
            )
            row = cursor.fetchone()
            barrier.wait()
            if row is None:
                return 0
            cursor.execute(
                "UPDATE notification SET status = 'PROCESSING', claim_token = %s, "
                "claimed_by = %s, claim_expires_at = now() WHERE id = %s",
                [uuid.uuid4(), f"w{i}", row[0]],
            )
            return cursor.rowcount

    assert sum(run_in_threads(10, claim_with_lock)) == 1


@pytest.mark.django_db
def test_claim_takes_due_rows_in_priority_then_due_then_creation_order():
    now = timezone.now()
    client = ClientFactory()
    low = NotificationFactory(client=client, priority=3, due_at=now - timedelta(hours=1))
    normal_late = NotificationFactory(client=client, priority=2, due_at=now - timedelta(minutes=1))
    normal_early = NotificationFactory(client=client, priority=2, due_at=now - timedelta(minutes=5))
    critical = NotificationFactory(client=client, priority=0, due_at=now)
    NotificationFactory(client=client, priority=0, due_at=now + timedelta(minutes=1))  # not due
    DbClock(now)
    claims = repo.notification_claim_due(worker="w", limit=10, claim_timeout_s=30)
    assert [c.id for c in claims] == [critical.id, normal_early.id, normal_late.id, low.id]


@pytest.mark.django_db
def test_claim_carries_each_column_in_its_field_with_json_decoded():
    notification = NotificationFactory(
        metadata={"order": "A-17"},
        user_id="u-1",
        template="welcome",
        payload={"name": "Ada"},
        fallback_channels=["sms", "push"],
    )
    [claim] = repo.notification_claim_due(worker="w", limit=1, claim_timeout_s=30)
    notification.refresh_from_db()
    assert claim == Claim(
        id=notification.id,
        claim_token=notification.claim_token,
        client_id=notification.client_id,
        channel="email",
        recipient=notification.recipient,
        subject="Hello",
        body="Your code is 123456",
        metadata={"order": "A-17"},
        priority=notification.priority,
        attempt_count=1,
        max_attempts=6,
        user_id="u-1",
        template="welcome",
        payload={"name": "Ada"},
        fallback_channels=("sms", "push"),
    )
    assert type(claim.fallback_channels) is tuple


@pytest.mark.django_db
def test_a_claim_of_empty_metadata_and_no_fallbacks_reads_them_empty():
    # The statement answers NULL for both (no JSON to decode); the claim reads them empty.
    NotificationFactory(metadata={}, fallback_channels=[])

    [claim] = repo.notification_claim_due(worker="w", limit=1, claim_timeout_s=30)

    assert claim.metadata == {}
    assert claim.fallback_channels == ()


@pytest.mark.django_db
def test_claim_records_the_attempt_it_starts():
    notification = NotificationFactory()
    now = DbClock().now
    [claim] = repo.notification_claim_due(worker="w1", limit=5, claim_timeout_s=30)
    attempt = DeliveryAttempt.objects.get(notification=notification)
    assert (attempt.number, attempt.worker, attempt.claim_token) == (1, "w1", claim.claim_token)
    assert attempt.finished_at is None
    notification.refresh_from_db()
    assert notification.claim_expires_at == now + timedelta(seconds=30)


@pytest.mark.django_db
def test_stale_workers_late_result_is_rejected_by_the_claim_token():
    notification = NotificationFactory()
    clock = DbClock()
    [slow] = repo.notification_claim_due(worker="slow", limit=1, claim_timeout_s=30)
    # The slow worker's claim expires; another worker reclaims and claims it again.
    clock.advance(31)
    assert [r.id for r in repo.notification_reclaim_expired()] == [notification.id]
    [fast] = repo.notification_claim_due(worker="fast", limit=1, claim_timeout_s=30)
    assert fast.claim_token != slow.claim_token

    late = Finish(slow.id, slow.claim_token, Status.SENT, Outcome.SENT, message_id="late")
    assert repo.notification_finish([late]) == []
    notification.refresh_from_db()
    assert notification.status == Status.PROCESSING  # untouched by the stale result

    current = Finish(fast.id, fast.claim_token, Status.SENT, Outcome.SENT, message_id="m-2")
    assert [(f.id, f.status) for f in repo.notification_finish([current])] == [
        (notification.id, "SENT")
    ]
    notification.refresh_from_db()
    assert (notification.status, notification.attempt_count) == (Status.SENT, 2)
    outcomes = list(
        DeliveryAttempt.objects.filter(notification=notification)
        .order_by("number")
        .values_list("worker", "outcome")
    )
    assert outcomes == [("slow", Outcome.ABANDONED), ("fast", Outcome.SENT)]


@pytest.mark.django_db
def test_a_crash_on_the_last_attempt_gets_one_final_resend_then_dead_letters():
    notification = NotificationFactory(max_attempts=2)
    clock = DbClock()
    for attempt in (1, 2, 3):
        [claim] = repo.notification_claim_due(worker="w", limit=1, claim_timeout_s=1)
        assert claim.attempt_count == attempt
        clock.advance(2)  # the worker dies; its claim expires
        [reclaimed] = repo.notification_reclaim_expired()
        expected = Status.DEAD_LETTERED if attempt == 3 else Status.PENDING
        assert reclaimed.status == expected
    notification.refresh_from_db()
    assert notification.attempt_count == 3  # max_attempts + the one re-check
    assert "did not report back" in notification.last_error


def function_statement(cursor, function: str) -> tuple[str, list[str]]:
    """The statement a PL/pgSQL function of the hot path answers with (its RETURN QUERY), as
    written in the function, and the function's settings."""
    cursor.execute("SELECT prosrc, proconfig FROM pg_proc WHERE proname = %s", [function])
    source, settings = cursor.fetchone()
    return source.split("RETURN QUERY", 1)[1].rsplit("END", 1)[0].strip().rstrip(";"), settings


def claim_plan(cursor) -> str:
    """The plan the claim keeps for a connection (`notification_claim_due_many`): the function's
    statement prepared under the function's own settings and explained as PostgreSQL's
    generic plan, the one PL/pgSQL keeps, without costs (they are not what is compared)."""
    statement, settings = function_statement(cursor, "notification_claim_due_many")
    parameters = (("p_limit", "$1"), ("p_worker", "$2"), ("p_claim_timeout_s", "$3"))
    parameters += (("p_aging_s", "$4"), ("p_held_clients", "$5"), ("p_held_counts", "$6"))
    for name, parameter in parameters:
        statement = re.sub(rf"\b{name}\b", parameter, statement)
    for setting in settings:
        name, value = setting.split("=", 1)
        cursor.execute("SELECT set_config(%s, %s, true)", [name, value])
    cursor.execute(
        "PREPARE kept_claim (integer, text, double precision, double precision, uuid[], "
        "integer[]) AS " + statement
    )
    try:
        cursor.execute(
            "EXPLAIN (COSTS OFF) EXECUTE kept_claim (100, 'w', 30, 300, %s, %s)",
            [[uuid.uuid4() for _ in range(8)], list(range(8))],
        )
        return "\n".join(row[0] for row in cursor.fetchall())
    finally:
        cursor.execute("DEALLOCATE kept_claim")


@pytest.mark.django_db
def test_claim_plan_reads_the_partial_pending_index():
    """40,000 rows from four clients, one in ten still waiting: the claim walks the (priority,
    client) pairs of the queue's pending index and each pair's due range, never a whole
    table."""
    clients = [ClientFactory().id for _ in range(4)]
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO notification (id, client_id, idempotency_key, request_fingerprint,
                channel, recipient, subject, body, priority, metadata, fallback_channels,
                status, send_at, due_at, attempt_count, max_attempts, operator_retries,
                created_at, updated_at)
            SELECT notifyqueue_uuid7(), (%s::uuid[])[1 + g %% 4], 'k' || g, '', 'email',
                'a@example.com', '', 'b', g %% 4, '{}', '[]',
                CASE WHEN g %% 10 = 0 THEN 'PENDING' ELSE 'SENT' END,
                now(), now(), 1, 6, 0, now(), now()
            FROM generate_series(1, 40000) AS g
            """,
            [clients],
        )
        cursor.execute("ANALYZE notification")
        cursor.execute("ANALYZE notification_queue")
        plan = claim_plan(cursor)
    assert "using queue_pending_client" in plan, plan
    assert "Seq Scan" not in plan, plan


@pytest.mark.django_db
def test_a_new_session_of_the_database_compiles_no_statement(database_url):
    """JIT compilation is off for the service's database (delivery 0002_functions): after a
    drained backlog the claim's estimated cost passed `jit_above_cost`, and a server built with
    LLVM compiled every claim, 52 ms for a statement that ran in 3. The setting is the
    database's, so every new session has it, whoever opens it."""
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT current_setting('jit')").fetchone()[0] == "off"


@pytest.mark.django_db
def test_claim_plan_starts_from_the_queue_even_with_stale_statistics():
    """Statistics from two moments: the queue's taken mid-drain (20,000 rows waiting), the
    record's after it (none PENDING); then a new burst. The planner believes the queue holds
    thousands of due rows and the record none. The claim still starts from the queue
    and looks records up by primary key; a claim that filtered the record by status let the
    planner start from a scan of the whole history (7.4 s a claim with 1,000,000 rows)."""
    client = ClientFactory().id
    notifications_insert_bulk(client_id=client, count=20_000, status="PENDING")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE notification_queue")  # mid-drain: 20,000 waiting
        cursor.execute("UPDATE notification SET status = 'SENT', sent_at = now()")
        cursor.execute("ANALYZE notification")  # after it: none PENDING
    notifications_insert_bulk(client_id=client, count=2_000, status="PENDING")
    with connection.cursor() as cursor:
        plan = claim_plan(cursor)
    assert not history_read_whole(plan) and "Seq Scan on notification " not in plan, plan
    assert "using queue_pending_client" in plan, plan


@pytest.mark.django_db
def test_claim_finds_each_due_rows_record_by_its_key_whatever_the_planner_prefers():
    """The claim locks each due row's record, found through its queue row. The planner cannot
    know how many rows a pair's share takes, so with statistics that counted a few thousand
    due rows it merge-joined all of them with the record's whole primary key: a walk of the
    entire history on every claim (seen with 100,000 rows sent: 23 million instructions a
    claim, bench/pg_instructions.py --statement turn). With nested loops priced out here,
    as those estimates priced them, the queue rows still meet their records one probe of the
    key at a time: no merge or hash join pairs them."""
    client = ClientFactory().id
    notifications_insert_bulk(client_id=client, count=2_000, status="PENDING")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE notification_queue")
        cursor.execute("ANALYZE notification")
        cursor.execute("SET LOCAL enable_nestloop = off")
        plan = claim_plan(cursor)
    pairing = [
        line for line in plan.splitlines() if re.search(r"(Merge|Hash) Cond: .*q_\d*\.id", line)
    ]
    assert not pairing, plan
    assert "Index Cond: (id = ANY (ARRAY[q_" in plan, plan


@pytest.mark.django_db
def test_claim_plan_probes_each_pair_even_when_one_client_has_a_large_backlog():
    """One client, 60,000 rows waiting, fresh statistics: finding which (priority, client)
    pairs have a due row is one index probe per pair. Written as a plain EXISTS, the planner
    preferred to read the whole queue and group it (27 ms a claim at 80,000 waiting, seen in
    the benchmark: two workers draining a long backlog ran at half one worker's rate)."""
    client = ClientFactory().id
    notifications_insert_bulk(client_id=client, count=60_000, status="PENDING")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE notification")
        cursor.execute("ANALYZE notification_queue")
        plan = claim_plan(cursor)
    assert "Seq Scan" not in plan, plan


@pytest.mark.django_db
def test_within_a_priority_the_claim_takes_clients_in_turn_not_the_oldest_backlog_first():
    """A flooded 100 rows before B created 5: a claim of 10 takes 5 of each (each client's
    share of the claim), oldest first within each, instead of A's 10 oldest. A CRITICAL of
    either still goes before both."""
    a, b = ClientFactory(), ClientFactory()
    now = timezone.now()
    flood = [
        NotificationFactory(client=a, due_at=now - timedelta(minutes=10, seconds=-i))
        for i in range(100)
    ]
    later = [NotificationFactory(client=b, due_at=now - timedelta(seconds=5 - i)) for i in range(5)]
    critical = NotificationFactory(client=a, priority=0, due_at=now)
    DbClock(now)
    claims = repo.notification_claim_due(worker="w", limit=11, claim_timeout_s=30)
    assert claims[0].id == critical.id
    assert {c.id for c in claims[1:]} == {n.id for n in flood[:5]} | {n.id for n in later}
    again = repo.notification_claim_due(worker="w", limit=4, claim_timeout_s=30)
    assert {c.id for c in again} == {n.id for n in flood[5:9]}  # B has nothing left due


@pytest.mark.django_db(transaction=True)
def test_cancel_racing_a_claim_exactly_one_wins_and_a_cancelled_row_is_never_sent():
    from notifications.services import NotificationNotCancellable, notification_cancel
    from tests.support.delivery_helpers import worker_build

    client = ClientFactory()
    winners = {"cancel": 0, "claim": 0}
    for _ in range(25):
        notification = NotificationFactory(client=client)

        def race(i, barrier, notification=notification):
            barrier.wait()
            if i == 0:
                try:
                    notification_cancel(
                        notification_id=notification.id, client_id=client.id, now=timezone.now()
                    )
                    return "cancel"
                except NotificationNotCancellable:
                    return None
            claims = repo.notification_claim_due(worker="w", limit=1, claim_timeout_s=30)
            return "claim" if claims else None

        results = [r for r in run_in_threads(2, race) if r]
        assert len(results) == 1, results
        winners[results[0]] += 1
        notification.refresh_from_db()
        expected = Status.CANCELLED if results == ["cancel"] else Status.PROCESSING
        assert notification.status == expected
        # Settle the round: a claimed row is released, a cancelled one stays cancelled.
        Notification.objects.filter(status=Status.PROCESSING).update(
            status=Status.SENT, claim_token=None, claim_expires_at=None
        )

    worker = worker_build()
    worker.run(until_empty=True)
    from delivery.models import SimulatedProviderMessage

    cancelled = Notification.objects.filter(status=Status.CANCELLED).values_list("id", flat=True)
    sent_keys = set(SimulatedProviderMessage.objects.values_list("idempotency_key", flat=True))
    assert not {f"{n}:email" for n in cancelled} & sent_keys
    assert winners["cancel"] + winners["claim"] == 25
    print(f"cancel won {winners['cancel']} rounds, claim won {winners['claim']}")


@pytest.mark.django_db
def test_the_finish_uses_its_kept_plan_from_a_connections_first_call():
    """PostgreSQL plans a kept statement's first five calls on a connection for their values
    unless told not to. For the finish those plans were made from statistics taken while no row
    was PROCESSING (as they always are: a claim lasts milliseconds); on a table of 2,500 rows
    they walked all of it for a claim of 250 and rescanned the claim's results for each row
    (1,600,000 instructions a row against 134,000: bench/pg_instructions.py --statement turn).
    The kept plan is the only one (force_generic_plan) once the record's statistics count
    10,000 rows (0019); the test below holds both regimes to what they read."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT proconfig FROM pg_proc WHERE proname = 'notification_finish_many'")
        [settings] = cursor.fetchone()
    assert "plan_cache_mode=force_generic_plan" in settings
    assert {"enable_seqscan=off", "enable_hashjoin=off", "enable_mergejoin=off"} <= set(settings)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("result", [Status.SENT, Status.PENDING, Status.DEAD_LETTERED])
@pytest.mark.parametrize("history", [0, 20_000], ids=["planned each call", "kept plan"])
def test_a_turn_reads_only_what_it_touches_after_a_burst_its_plans_never_saw(history, result):
    """A worker's connection makes the plans it keeps (the finish's, the claim's, its
    triggers') on its first turns; then 20,000 notifications arrive, not yet analyzed. A turn
    of one row (a create, its claim, its admission, its finish as sent, retried or
    dead-lettered, with the client's webhook event) still visits about a hundred pages of the
    whole schema, whether the plans are kept (the statistics counted 20,000 records sent) or
    made for each call (an installation's first hours): 98 to 113 when written. A finish kept
    from the installation's first message walked the whole record for the row it finished
    (20,191 to 20,201 pages), and one that found it by `id = ANY (...)` walked
    `notification_recipient` whole (354 to 365): with so few rows every index holding `id`
    costs what the primary key costs, which is why a small record is planned for each call."""
    connection.close()  # a server connection of its own: no plan kept from an earlier test
    client = ClientFactory(webhook_url="https://hooks.example.com/notify")
    if history:
        notifications_insert_bulk(client_id=client.id, count=history, status="SENT")
    outcome = {
        Status.SENT: Outcome.SENT,
        Status.PENDING: Outcome.TEMPORARY_FAILURE,
        Status.DEAD_LETTERED: Outcome.PERMANENT_FAILURE,
    }[result]

    def turn() -> list:
        NotificationFactory(client=client)
        claims = repo.notification_claim_due(worker="w", limit=1, claim_timeout_s=30)
        admitted = RateLimitRepository().recipients_admit(
            claims=[
                AdmissionRequest(c.channel, c.client_id, c.recipient, c.id, c.claim_token, False)
                for c in claims
            ],
            limit=100,
            window_s=60,
        )
        assert admitted == {c.id for c in claims}
        delay = 30 if result == Status.PENDING else None
        return repo.notification_finish(
            [Finish(c.id, c.claim_token, result, outcome, delay_s=delay) for c in claims]
        )

    turn()  # the installation's first message
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    for _ in range(6):  # past PL/pgSQL's five plans for their values, where a trigger has them
        turn()
    notifications_insert_bulk(client_id=client.id, count=20_000, status="PENDING")

    with transaction.atomic():  # the counters are this transaction's
        before = pages_visited_by_relation()
        [finished] = turn()
        after = pages_visited_by_relation()

    visited = {name: after[name] - before[name] for name in after if after[name] > before[name]}
    assert finished.status == result
    # Planning a statement on the record also reads the first pages of each partition's indexes.
    assert sum(visited.values()) <= 200 + planning_pages_of_partitions(), sorted(
        visited.items(), key=lambda item: -item[1]
    )


@pytest.mark.django_db
def test_the_claim_uses_its_kept_plan_from_a_connections_first_call():
    """Planned on every call, a claim of one row spent 3.6 of its 4.6 million instructions
    parsing and planning (bench/pg_instructions.py --statement turn --batch-size 1). The claim
    is a PL/pgSQL function whose generic plan is the only one once the record's statistics
    count 10,000 rows, with every plan step that could read a table
    or an index whole turned off."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT proconfig FROM pg_proc WHERE proname = 'notification_claim_due_many'"
        )
        [settings] = cursor.fetchone()
    assert "plan_cache_mode=force_generic_plan" in settings
    assert {
        "enable_seqscan=off",
        "enable_bitmapscan=off",
        "enable_hashjoin=off",
        "enable_mergejoin=off",
        "enable_memoize=off",
        "enable_sort=off",
        "enable_incremental_sort=off",
    } <= set(settings)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "records, kept", [(0, False), (10_000, True)], ids=["a new installation", "10,000 records"]
)
def test_the_claim_and_the_finish_keep_their_plans_once_the_record_counts_10000_rows(records, kept):
    """The claim and the finish keep one plan for a server connection once the record's
    statistics count 10,000 rows, and plan each call for itself before (migrations delivery
    0018 and 0019). A kept plan lives in the connection's memory after the call, where
    PostgreSQL names it by its statement (`pg_backend_memory_contexts`: a `CachedPlan`); a plan
    made for one call is freed when the call ends. Kept, a claim of one row costs PostgreSQL
    1.3 million instructions instead of 4.6 (bench/pg_instructions.py --statement turn
    --batch-size 1); kept from a few rows, the plans walked indexes whole (the burst tests
    of this file)."""
    connection.close()  # a server connection of its own: no plan kept from an earlier test
    client = ClientFactory()
    notifications_insert_bulk(client_id=client.id, count=records, status="SENT")
    NotificationFactory(client=client)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE notification")
    [claim] = repo.notification_claim_due(worker="w", limit=1, claim_timeout_s=30)
    repo.notification_finish(
        [Finish(claim.id, claim.claim_token, Status.SENT, Outcome.SENT, message_id="m")]
    )

    with connection.cursor() as cursor:
        plans = {}
        for function in ("notification_claim_due_many", "notification_finish_many"):
            statement, _ = function_statement(cursor, function)
            statement = re.sub(r"^(\s*--.*\n)+", "", statement).lstrip()  # as PL/pgSQL keeps it
            cursor.execute(
                """
                SELECT count(*) FROM pg_backend_memory_contexts
                 WHERE name = 'CachedPlan' AND starts_with(ident, left(%s, 200))
                """,
                [statement],
            )
            plans[function] = cursor.fetchone()[0] == 1
    assert plans == dict.fromkeys(plans, kept)


@pytest.mark.django_db
def test_the_claims_kept_plan_is_one_whatever_the_statistics_said_when_it_was_made():
    """A kept plan is made once, from the statistics of that moment, and lasts until the next
    ANALYZE of a table it reads: made while the queue was empty (a quiet installation with a
    history), it serves the next burst; made from a full queue, the next quiet hour; made
    from figures of two moments (the queue's mid-drain, the record's after it), whatever
    comes. Each time it is the same plan: the walk of the queue's pending index, every record
    found by its key."""
    client = ClientFactory().id
    plans = {}
    notifications_insert_bulk(client_id=client, count=20_000, status="SENT")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE notification")
        cursor.execute("ANALYZE notification_queue")
        plans["queue empty"] = claim_plan(cursor)
    notifications_insert_bulk(client_id=client, count=20_000, status="PENDING")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE notification")
        cursor.execute("ANALYZE notification_queue")
        plans["queue full"] = claim_plan(cursor)
        cursor.execute("UPDATE notification SET status = 'SENT', sent_at = now()")
        cursor.execute("ANALYZE notification")  # the queue's figures still count 20,000
        plans["figures of two moments"] = claim_plan(cursor)

    plan = plans["queue empty"]
    assert plans == dict.fromkeys(plans, plan), "\n\n".join(plans.values())
    assert "using queue_pending_client" in plan, plan
    assert not re.search(r"Seq Scan|Bitmap|Hash Join|Merge Join", plan), plan
    # Each week's partition by its primary key. (The default partition, empty here, holds no
    # row of a week: the executor prunes it for a week's id, whichever index its plan names.)
    week_scans = re.findall(r"Index Scan using (\w+) on (notification_\d{8}) ", plan)
    assert week_scans, plan
    assert all(index == f"{week}_pkey" for index, week in week_scans), plan


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("history", [0, 20_000], ids=["planned each call", "kept plan"])
def test_a_claim_reads_only_what_it_claims_after_a_burst_its_plan_never_saw(history):
    """A worker's connection makes the claim's plan on its first claim, on tables with no row
    due. Then 20,000 rows arrive, not yet analyzed. A claim of 100 visits about 2,500 pages,
    whether its plan is kept (the statistics counted 20,000 records sent) or made for each
    call (an installation's first hours). A plan kept from empty tables probed
    `notification_recipient` whole for every claimed row instead of the primary key (52,832
    pages), which is why an empty record is planned for each call."""
    tables = ("notification", "notification_queue", "delivery_attempt")
    connection.close()  # a server connection of its own: no plan kept from an earlier test
    client = ClientFactory()
    if history:
        notifications_insert_bulk(client_id=client.id, count=history, status="SENT")
    with connection.cursor() as cursor:
        for table in tables:
            cursor.execute(f"ANALYZE {table}")
    assert repo.notification_claim_due(worker="w", limit=1, claim_timeout_s=30) == []
    notifications_insert_bulk(client_id=client.id, count=20_000, status="PENDING")

    with transaction.atomic():  # the counters are this transaction's
        before = pages_visited(tables)
        claims = repo.notification_claim_due(worker="w", limit=100, claim_timeout_s=30)
        visited = pages_visited(tables) - before

    assert len(claims) == 100
    assert visited <= 10_000, visited


@pytest.mark.django_db(transaction=True)
def test_a_circuit_hold_and_release_read_only_what_they_touch_whatever_the_backlog():
    """The hold of a refused claim (`notification_circuit_hold_many`) and the release when the
    circuit closes (`notification_circuit_release`) visit about as many pages behind a backlog
    of 20,000 due rows on the same channel as on an empty queue: the hold reads its rows by
    key, and the release finds the held rows through their own index, never the backlog."""
    from delivery.circuits.repositories import CircuitRepository
    from delivery.repositories import Hold

    circuits = CircuitRepository()
    circuits.failed(name="email:simulated", threshold=1)
    client = ClientFactory()

    def hold_and_release() -> dict[str, int]:
        NotificationFactory(client=client, priority=0)  # claimed first, ahead of any backlog
        [claim] = repo.notification_claim_due(worker="w", limit=1, claim_timeout_s=30)
        with transaction.atomic():
            before = pages_visited_by_relation()
            [held] = repo.notification_circuit_hold(
                [Hold(claim.id, claim.claim_token, "email:simulated")],
                cooldown_s=30,
                max_hold_s=86_400,
            )
            released = repo.notification_circuit_release(channel="email")
            after = pages_visited_by_relation()
        assert held.status == Status.PENDING and held.held_until is not None
        assert released >= 1
        Notification.objects.filter(id=claim.id).update(status=Status.CANCELLED)
        return {name: after[name] - before[name] for name in after if after[name] > before[name]}

    empty = sum(hold_and_release().values())
    notifications_insert_bulk(client_id=client.id, count=20_000, status="PENDING")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    visited = hold_and_release()
    assert sum(visited.values()) <= empty + 60, (
        empty,
        sorted(visited.items(), key=lambda i: -i[1]),
    )


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_recipient_with_100000_held_rows_costs_the_other_recipients_claims_nothing():
    """One recipient far over its rate limit, its 100,000 rows held by the limit (the
    deferrals scheduled the backlog a chunk at a time, one slot apart, ten an hour, years
    ahead), in the same client and at the same priority as everyone else. A claim of 100
    other recipients' rows, against the same claim beside the same recipient's 100,000 rows
    already sent (the same record size): the kept plan reads the (priority, client) pair's due
    range of queue_pending_client, past whose end the held rows lie, and visits as many of its
    pages (11-14 in runs so far); the claim as a whole visits 13 % more (3,585 pages against
    3,156-3,248), which is the queue's primary key one level deeper with 100,000 more live rows
    (601 pages against 401) and the record's pages the deferrals rewrote, not a read of the
    held rows. Once the queue is vacuumed, that is: the deferrals that held the backlog moved
    100,000 rows, a thousand or so each, and until VACUUM removes their old index entries
    (autovacuum comes within its naptime: the queue's scale factor is 0.05) each claim steps
    over those still there, 3,862 pages of queue_pending_client a claim where 14 do
    afterwards. The test's VACUUM first waits for every snapshot older than the deferrals to
    end (an autovacuum ANALYZE of the table just filled is one), else it could not remove
    them either."""
    from ratelimits.services import DEFER_AHEAD_ROWS

    tables = ("notification", "notification_queue", "delivery_attempt", "delivery_client_turn")
    held, limit, window_s = "held@example.com", 10, 3600.0
    connection.close()  # a server connection of its own: no plan kept from an earlier test
    client = ClientFactory()
    # Everyone else: 20,000 rows due now, each to its own recipient.
    notifications_insert_bulk(
        client_id=client.id, count=20_000, status="PENDING", attempt_count=0, last_error=None
    )

    def backlog_insert(status: str) -> None:
        notifications_insert_bulk(
            client_id=client.id,
            count=100_000,
            status=status,
            recipient=held,
            start=timezone.now() - timedelta(hours=2),
            attempt_count=0,
            last_error=None,
        )

    def claim_pages() -> tuple[int, int]:
        """Pages a claim of 100 visits: in all, and of queue_pending_client."""
        vacuum_after_every_snapshot("notification_queue", analyze=True)
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE notification")
        with transaction.atomic():  # the counters are this transaction's
            before, index_before = pages_visited(tables), pages_visited_by_relation()
            claims = repo.notification_claim_due(worker="w", limit=100, claim_timeout_s=30)
            visited, index_after = pages_visited(tables), pages_visited_by_relation()
        assert len(claims) == 100
        assert held not in {c.recipient for c in claims}
        due_range = index_after["queue_pending_client"] - index_before["queue_pending_client"]
        return int(visited - before), due_range

    # The control: the recipient's 100,000 rows all sent.
    backlog_insert("SENT")
    claim_pages()  # the connection's first claim makes its plan
    sent = claim_pages()
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM notification WHERE recipient = %s", [held])
        cursor.execute("VACUUM notification")

    # The backlog: 100,000 rows for the recipient, due before everyone else's; its window
    # holds its limit already; claims take its first rows and the admission's deferral
    # (ratelimit_defer_many) gives them back and holds the recipient's next rows, a bounded
    # number each time, until none of its rows is due.
    backlog_insert("PENDING")
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO ratelimit_delivery (key, at, notification_id, claim_token) "
            "SELECT ratelimit_key('email', %s, %s), notifyqueue_now() - g * interval '1 minute', "
            "gen_random_uuid(), gen_random_uuid() FROM generate_series(1, %s) AS g",
            [client.id, held, limit],
        )
    limits, deferrals = RateLimitRepository(), 0
    while True:
        claims = repo.notification_claim_due(worker="w", limit=100, claim_timeout_s=30)
        if held not in {c.recipient for c in claims}:
            break
        assert {c.recipient for c in claims} == {held}
        deferrals += 1
        settled = limits.recipients_defer(
            claims=[
                AdmissionRequest(
                    channel=c.channel,
                    client_id=c.client_id,
                    recipient=c.recipient,
                    notification_id=c.id,
                    claim_token=c.claim_token,
                    critical=False,
                )
                for c in claims
            ],
            limit=limit,
            window_s=window_s,
            ahead=DEFER_AHEAD_ROWS,
        )
        assert len(settled) == len(claims)
    # What the claim that ended the loop took goes back, to be claimed again below.
    Notification.objects.filter(id__in=[c.id for c in claims]).update(
        status="PENDING", claim_token=None, claimed_by=None, claim_expires_at=None
    )
    assert deferrals <= 100_000 / DEFER_AHEAD_ROWS + 1
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*), min(due_at) > notifyqueue_now() FROM notification_queue "
            "WHERE status = 'PENDING' AND recipient_digest = md5(%s)::uuid",
            [held],
        )
        assert cursor.fetchone() == (100_000, True)

    with_backlog = claim_pages()
    assert with_backlog[1] <= sent[1] + 10, (sent, with_backlog)
    assert with_backlog[0] <= sent[0] * 1.25, (sent, with_backlog)
    # In a transaction, so that the function's settings hold for the plan (claim_plan sets
    # them for the transaction) as they do for the function's own statement: the
    # deferrals' claims get the turn table analyzed, and under the server's defaults its one
    # row is read by a sequential scan.
    with transaction.atomic(), connection.cursor() as cursor:
        plan = claim_plan(cursor)
    assert "using queue_pending_client" in plan, plan
    assert "Seq Scan" not in plan, plan
    print(f"pages a claim of 100: {sent} beside 100,000 sent rows, {with_backlog} beside held")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_client_whose_100000_rows_are_all_held_costs_another_clients_claim_a_probe():
    """Another client's PENDING rows, every one held for later (none due), at the same
    priority. The claim probes that client's (priority, client) pair for a due row: written as
    a row comparison, PostgreSQL 16 walked the whole pair past the range's end (1,446 pages of
    queue_pending_client a claim beside 100,000 such rows); with equalities and a bound on
    due_at it stops at once. A claim of 100 of this client's rows visits 14 pages beside 1,000
    held rows and 23 beside 100,000 (in runs so far): the index is a level deeper, and each of
    the claim's probes (the pairs, their due rows, the rows locked) descends one page more."""
    connection.close()  # a server connection of its own: no plan kept from an earlier test
    held, client = ClientFactory(), ClientFactory()
    notifications_insert_bulk(
        client_id=client.id, count=20_000, status="PENDING", attempt_count=0, last_error=None
    )

    def claim_pages() -> int:
        """Pages of queue_pending_client a claim of 100 visits."""
        vacuum_after_every_snapshot("notification_queue", analyze=True)
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE notification")
        with transaction.atomic():  # the counters are this transaction's
            before = pages_visited_by_relation()
            claims = repo.notification_claim_due(worker="w", limit=100, claim_timeout_s=30)
            after = pages_visited_by_relation()
        assert len(claims) == 100 and {c.client_id for c in claims} == {client.id}
        return after["queue_pending_client"] - before["queue_pending_client"]

    def held_insert(count: int) -> None:
        notifications_insert_bulk(
            client_id=held.id,
            count=count,
            status="PENDING",
            start=timezone.now() + timedelta(days=1),
            attempt_count=0,
            last_error=None,
        )

    held_insert(1_000)
    claim_pages()  # the connection's first claim makes its plan
    few = claim_pages()
    held_insert(99_000)
    many = claim_pages()

    print(f"pages of queue_pending_client a claim of 100: {few} beside 1,000 held, {many} 100,000")
    assert many <= few + 15, (few, many)
    with connection.cursor() as cursor:
        plan = claim_plan(cursor)
    assert "using queue_pending_client" in plan, plan
