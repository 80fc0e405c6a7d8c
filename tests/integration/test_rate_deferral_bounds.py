"""A recipient far over its rate limit costs a deferral, a worker and the client's other
recipients a bounded amount, whatever its backlog (docs/decisions/0024-bounded-deferrals.md)."""

from __future__ import annotations

import math
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction

from delivery.repositories import DeliveryRepository
from notifications.models import Notification, Status
from ratelimits.repositories import AdmissionRequest, RateLimitRepository
from ratelimits.services import DEFER_AHEAD_ROWS, RateLimit
from tests.support.clock import database_now
from tests.support.delivery_helpers import simulated_providers
from tests.support.factories import ClientFactory
from tests.support.operator_helpers import notifications_insert_bulk
from tests.support.reads import pages_visited_by_relation, vacuum_after_every_snapshot

pytestmark = pytest.mark.django_db(transaction=True)

LIMIT, WINDOW_S = 10, 3600.0


def window_fill(client_id, recipient: str) -> None:
    """The key's window holds its limit: deliveries a minute apart, the newest a minute ago."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO ratelimit_delivery (key, at, notification_id, claim_token) "
            "SELECT ratelimit_key('email', %s, %s), notifyqueue_now() - g * interval '1 minute', "
            "gen_random_uuid(), gen_random_uuid() FROM generate_series(1, %s) AS g",
            [client_id, recipient, LIMIT],
        )


def window_count(client_id, recipient: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM ratelimit_delivery WHERE key = ratelimit_key('email', %s, %s) "
            "AND at > notifyqueue_now() - make_interval(secs => %s)",
            [client_id, recipient, WINDOW_S],
        )
        return cursor.fetchone()[0]


def backlog_insert(client_id, recipient: str, count: int, *, held: bool) -> None:
    """`count` rows for `recipient`, created two hours ago, ahead of everyone's. Held: as the
    deferrals leave them, each in its own slot `LIMIT` a window apart, hours to years ahead,
    marked held since it was due."""
    notifications_insert_bulk(
        client_id=client_id,
        count=count,
        status="PENDING",
        recipient=recipient,
        start=database_now() - timedelta(hours=2),
        attempt_count=0,
        last_error=None,
    )
    if held:
        with connection.cursor() as cursor:
            cursor.execute(
                """
                UPDATE notification AS n
                SET due_at = s.at + make_interval(secs => %(window_s)s * (o.j / %(limit)s + 1)),
                    rate_deferred_from = n.due_at
                FROM (SELECT id, row_number() OVER (ORDER BY created_at, id) - 1 AS j
                      FROM notification
                      WHERE recipient = %(recipient)s AND client_id = %(client_id)s) AS o,
                     (SELECT at, row_number() OVER (ORDER BY at) - 1 AS k
                      FROM ratelimit_delivery
                      WHERE key = ratelimit_key('email', %(client_id)s, %(recipient)s)) AS s
                WHERE n.id = o.id AND s.k = o.j %% %(limit)s
                """,
                {
                    "window_s": WINDOW_S,
                    "limit": LIMIT,
                    "recipient": recipient,
                    "client_id": client_id,
                },
            )


def slot(client_id, recipient: str, j: int):
    """The j-th slot of the key's window: its (j mod LIMIT)-th delivery, (j div LIMIT) + 1
    windows later."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT at + make_interval(secs => %s) FROM ratelimit_delivery "
            "WHERE key = ratelimit_key('email', %s, %s) ORDER BY at OFFSET %s LIMIT 1",
            [WINDOW_S * (j // LIMIT + 1), client_id, recipient, j % LIMIT],
        )
        return cursor.fetchone()[0]


def request(claim) -> AdmissionRequest:
    return AdmissionRequest(
        channel=claim.channel,
        client_id=claim.client_id,
        recipient=claim.recipient,
        notification_id=claim.id,
        claim_token=claim.claim_token,
        critical=False,
    )


def deferral(claims, *, ahead: int = DEFER_AHEAD_ROWS) -> dict:
    """The worker's deferral of these claims: checked again under their keys' locks, then
    deferred in one statement."""
    return RateLimitRepository().recipients_defer(
        claims=[request(c) for c in claims], limit=LIMIT, window_s=WINDOW_S, ahead=ahead
    )


def test_a_deferrals_cost_is_the_same_beside_100_and_100000_held_rows():
    """A new row for a recipient at its limit, claimed and deferred, beside the recipient's
    100 rows already held by earlier deferrals, then beside 100,000: the deferral reads the
    window, one backward probe of the key's waiting rows by due time for the last slot handed
    out and the head of the client's due range, so it visits as many pages either way (its
    indexes a level deeper at most), where scheduling the whole backlog again read and sorted
    every held row. The re-check under the keys' locks that comes first is counted too: it probes
    the key's held rows for one. The new row takes the slot after the last held row's, not
    one of theirs."""
    repo = DeliveryRepository()

    def defer_new_row(client, recipient: str, held: int) -> tuple[dict[str, int], object]:
        window_fill(client.id, recipient)
        backlog_insert(client.id, recipient, held, held=True)
        notifications_insert_bulk(
            client_id=client.id,
            count=1,
            status="PENDING",
            recipient=recipient,
            attempt_count=0,
            last_error=None,
        )
        vacuum_after_every_snapshot("notification", analyze=True)
        vacuum_after_every_snapshot("notification_queue", analyze=True)
        [claim] = repo.notification_claim_due(worker="w", limit=1, claim_timeout_s=30)
        with transaction.atomic():  # the counters are this transaction's
            before = pages_visited_by_relation()
            deferred = deferral([claim])[claim.id]
            after = pages_visited_by_relation()
        return {name: after[name] - before.get(name, 0) for name in after}, deferred

    # History first, so that the record and its indexes are as deep for both (the same
    # depth more or less is not the held rows' doing).
    notifications_insert_bulk(client_id=ClientFactory().id, count=100_000, status="SENT")
    small_client, large_client = ClientFactory(), ClientFactory()
    small, small_deferred = defer_new_row(small_client, "few@example.com", 100)
    large, large_deferred = defer_new_row(large_client, "many@example.com", 100_000)

    # 145 and 149 pages here: each index the statements descend (the record's, the queue's)
    # may be a level deeper with 100,000 more entries, a page a descent. A read of the held
    # rows is over a thousand pages of an index and thousands of the record.
    assert sum(large.values()) <= sum(small.values()) + 25, (small, large)
    assert large["queue_pending_recipient"] <= small["queue_pending_recipient"] + 10, large
    assert large["queue_pending_client"] <= small["queue_pending_client"] + 10, large
    assert large["notification"] <= small["notification"] + 10, large
    # The held rows took slots 0 to 99 (99,999); the new row takes the next.
    assert small_deferred.due_at == slot(small_client.id, "few@example.com", 100)
    assert large_deferred.due_at == slot(large_client.id, "many@example.com", 100_000)
    print(
        f"pages a deferral visits: {sum(small.values())} beside 100 held rows, "
        f"{sum(large.values())} beside 100,000"
    )


def test_a_worker_meeting_100_over_limit_claims_of_one_key_defers_them_in_one_statement():
    """A claim of 100 rows, all to one recipient whose window is full: one deferral for the
    100 (one statement), each given back PENDING with its attempt returned, no two in one
    slot, none sent, the window still at its limit."""
    from delivery.services import RetryPolicy
    from delivery.worker import Worker, WorkerConfig

    class CountingRateLimits(RateLimitRepository):
        deferrals: list[int] = []

        def recipients_defer(self, *, claims, **kwargs):
            if claims:
                self.deferrals.append(len(claims))
            return super().recipients_defer(claims=claims, **kwargs)

    client = ClientFactory()
    recipient = "busy@example.com"
    window_fill(client.id, recipient)
    backlog_insert(client.id, recipient, 100, held=False)
    limits = CountingRateLimits()
    worker = Worker(
        providers=simulated_providers(),
        config=WorkerConfig(
            concurrency=4,
            batch_size=100,
            poll_interval_s=0.05,
            heartbeat_s=60,
            rate_limit=RateLimit(limit=LIMIT, window_s=WINDOW_S),
        ),
        policy=RetryPolicy(base_s=0.5, max_s=60),
        rate_limits=limits,
    )
    try:
        step = worker.run_once()
    finally:
        worker.stop()

    assert step.claimed == 100
    assert limits.deferrals == [100]
    rows = Notification.objects.filter(recipient=recipient)
    assert set(rows.values_list("status", flat=True)) == {Status.PENDING}
    assert set(rows.values_list("attempt_count", flat=True)) == {0}
    due = sorted(rows.values_list("due_at", flat=True))
    # Ten slots a window, each taken once: the 100 rows fill ten windows, ten to a window.
    assert len(set(due)) == 100
    assert due[0] > database_now() + timedelta(seconds=WINDOW_S / 2)
    assert (due[-1] - due[0]).total_seconds() < WINDOW_S * 10
    assert window_count(client.id, recipient) == LIMIT
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT outcome, count(*) FROM delivery_attempt a JOIN notification n "
            "ON n.id = a.notification_id WHERE n.recipient = %s GROUP BY outcome",
            [recipient],
        )
        assert cursor.fetchall() == [("RATE_LIMITED", 100)]


def test_the_clients_other_recipients_are_sent_within_the_bound_behind_100000_held_rows():
    """100,000 rows of one recipient at its limit, due before anything else of its client;
    behind them, 50 rows of other recipients. Each step the client's claim takes the held
    recipient's rows, and the one deferral moves them and the recipient's next rows at the
    head of the client's due range (up to DEFER_AHEAD_ROWS) out of the way: the others are
    claimed within ceil(100,000 / DEFER_AHEAD_ROWS) + 2 steps, and sent, while none of the
    held recipient's rows is, its window at its limit throughout."""
    from delivery.services import RetryPolicy
    from delivery.worker import Worker, WorkerConfig

    client = ClientFactory()
    held, backlog = "held@example.com", 100_000
    window_fill(client.id, held)
    backlog_insert(client.id, held, backlog, held=False)
    notifications_insert_bulk(
        client_id=client.id, count=50, status="PENDING", attempt_count=0, last_error=None
    )
    vacuum_after_every_snapshot("notification", analyze=True)
    vacuum_after_every_snapshot("notification_queue", analyze=True)
    others = Notification.objects.filter(client=client).exclude(recipient=held)
    worker = Worker(
        providers=simulated_providers(),
        config=WorkerConfig(
            concurrency=4,
            batch_size=100,
            poll_interval_s=0.05,
            heartbeat_s=60,
            rate_limit=RateLimit(limit=LIMIT, window_s=WINDOW_S),
        ),
        policy=RetryPolicy(base_s=0.5, max_s=60),
    )
    bound = math.ceil(backlog / DEFER_AHEAD_ROWS) + 2
    started, steps = time.monotonic(), 0
    try:
        while others.exclude(status=Status.SENT).exists():
            steps += 1
            assert steps <= bound, (steps, others.filter(status=Status.SENT).count())
            worker.run_once(wait_s=0.2)
    finally:
        worker.stop()
    elapsed = time.monotonic() - started

    assert not Notification.objects.filter(recipient=held, status=Status.SENT).exists()
    assert window_count(client.id, held) == LIMIT
    print(f"the others sent after {steps} steps, {elapsed:.1f} s (bound {bound} steps)")
