"""The narrow queue table (notification_queue) against the record it indexes.

Its triggers must keep it equal to the record's non-SENT rows whatever statement changes the
record, and the record must keep no index on a column the worker changes, so that a claim
and a finish are HOT updates (no index entry of the wide table written).
"""

from __future__ import annotations

import re
import time

import psycopg
import pytest
from django.db import connection, transaction

from delivery import upkeep as delivery_upkeep
from delivery.repositories import DeliveryRepository, Finish
from notifications.models import Notification, Status
from notifications.repositories import ListFilters, NotificationRepository
from tests.support.clock import DbClock
from tests.support.delivery_helpers import worker_build
from tests.support.factories import ClientFactory, NotificationFactory
from tests.support.operator_helpers import notifications_insert_bulk
from tests.support.queue_table import QUEUE_COLUMNS, queue_differences
from tests.support.reads import pages_visited, table_reads, table_reads_since
from tests.support.webhook_factories import WebhookEventFactory
from webhooks import repositories as webhooks

pytestmark = pytest.mark.django_db

delivery = DeliveryRepository()
notifications = NotificationRepository()


def queue_rows() -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {QUEUE_COLUMNS} FROM notification_queue ORDER BY id")
        return cursor.fetchall()


def assert_queue_mirrors_the_record() -> None:
    assert queue_differences() == []


def test_every_kind_of_write_keeps_the_queue_equal_to_the_record():
    client = ClientFactory()
    waiting = [NotificationFactory(client=client, priority=2) for _ in range(7)]
    notifications_insert_bulk(client_id=client.id, count=3)  # DEAD_LETTERED
    notifications_insert_bulk(client_id=client.id, count=2, status="SENT")
    assert len(queue_rows()) == 10
    assert_queue_mirrors_the_record()
    clock = DbClock()
    clock.advance(1)

    # The worker: a claim, then each kind of finish.
    claims = delivery.notification_claim_due(worker="w", limit=5, claim_timeout_s=30)
    assert len(claims) == 5
    assert_queue_mirrors_the_record()
    sent, retried, failed, dead, stalled = claims
    delivery.notification_finish(
        [
            Finish(id=sent.id, claim_token=sent.claim_token, status="SENT", outcome="ACCEPTED"),
            Finish(
                id=retried.id,
                claim_token=retried.claim_token,
                status="PENDING",
                outcome="TEMPORARY_FAILURE",
                delay_s=60,
            ),
            Finish(
                id=failed.id,
                claim_token=failed.claim_token,
                status="FAILED",
                outcome="PERMANENT_FAILURE",
            ),
            Finish(
                id=dead.id,
                claim_token=dead.claim_token,
                status="DEAD_LETTERED",
                outcome="TEMPORARY_FAILURE",
            ),
        ]
    )
    assert sent.id not in {row[0] for row in queue_rows()}
    assert_queue_mirrors_the_record()

    # The reaper, past the stalled claim's expiry by the database clock.
    clock.advance(31)
    assert [r.id for r in delivery.notification_reclaim_expired()] == [stalled.id]
    assert_queue_mirrors_the_record()

    # The API's cancel and an operator's retry.
    unclaimed = [n for n in waiting if n.id not in {c.id for c in claims}]
    assert notifications.cancel_pending(
        notification_id=unclaimed[0].id, client_id=client.id, now=clock.now
    )
    assert notifications.retry_one(notification_id=failed.id, operator="op", now=clock.now)
    assert_queue_mirrors_the_record()

    # The ORM, and a delete (retention's statement is a DELETE as well).
    Notification.objects.filter(id=unclaimed[1].id).update(priority=0)
    Notification.objects.filter(status=Status.CANCELLED).delete()
    assert_queue_mirrors_the_record()
    statuses = sorted(row[2] for row in queue_rows())
    assert statuses == ["DEAD_LETTERED"] * 4 + ["PENDING"] * 4


def test_no_index_of_the_record_names_a_column_a_claim_or_a_finish_changes():
    """The condition for HOT updates: no index (key, expression or predicate) of the wide
    table mentions a column the claim, the finish, the reaper or a retry writes."""
    changed = {
        "status",
        "due_at",
        "claim_token",
        "claimed_by",
        "claim_expires_at",
        "attempt_count",
        "last_error",
        "sent_at",
        "updated_at",
        "operator_retries",
        "last_retried_at",
        "last_retried_by",
    }
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT array(SELECT attname FROM pg_attribute
                          WHERE attrelid = i.indrelid AND attnum = ANY (i.indkey)),
                   concat_ws(' ', pg_get_expr(i.indpred, i.indrelid),
                             pg_get_expr(i.indexprs, i.indrelid))
              FROM pg_index AS i
             WHERE i.indrelid = 'notification'::regclass
            """
        )
        indexed = set()
        for keys, expressions in cursor.fetchall():
            indexed |= set(keys) | set(re.findall(r"[a-z_]+", expressions))
    assert indexed
    assert not indexed & changed, indexed & changed


def test_a_claim_and_its_finish_write_no_index_entry_of_the_record():
    client = ClientFactory()
    for _ in range(5):
        NotificationFactory(client=client)

    def counts() -> tuple[int, int]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT sum(pg_stat_get_xact_tuples_updated(relid)),"
                " sum(pg_stat_get_xact_tuples_hot_updated(relid))"
                " FROM pg_partition_tree('notification') WHERE isleaf"
            )
            return cursor.fetchone()

    updated_before, hot_before = counts()
    claims = delivery.notification_claim_due(worker="w", limit=5, claim_timeout_s=30)
    delivery.notification_finish(
        [
            Finish(id=c.id, claim_token=c.claim_token, status="SENT", outcome="ACCEPTED")
            for c in claims
        ]
    )
    updated, hot = counts()

    assert len(claims) == 5
    assert updated - updated_before == 10
    assert hot - hot_before == 10
    assert queue_rows() == []


def test_the_list_by_each_status_is_the_records_own_filter():
    """Every status lists the same rows, in the same order, as the record's own status filter,
    whichever index serves it (the queue's for all but SENT; queue_claim_expiry for
    PROCESSING)."""
    client = ClientFactory()
    for status in ("SENT", "FAILED", "DEAD_LETTERED", "CANCELLED", "SUPPRESSED"):
        notifications_insert_bulk(client_id=client.id, count=3, status=status)
    for _ in range(6):
        NotificationFactory(client=client)
    DbClock().advance(1)
    assert len(delivery.notification_claim_due(worker="w", limit=2, claim_timeout_s=30)) == 2

    for status in Status.values:
        filters = ListFilters(status=status)
        for client_id in (client.id, None):
            page = notifications.list_page(
                client_id=client_id, filters=filters, after=None, before=None, limit=50
            )
            expected = list(
                Notification.objects.filter(status=status)
                .order_by("-created_at", "-id")
                .values_list("id", flat=True)
            )
            assert [r.id for r in page.records] == expected, status
            assert expected or status not in ("PENDING", "PROCESSING")


def test_a_truncate_of_the_record_empties_the_queue():
    """TRUNCATE fires no DELETE trigger; without its own, the queue kept the truncated rows,
    which the backlog check counted against the client's cap (`notification_queue_truncated`)."""
    client = ClientFactory()
    notifications_insert_bulk(client_id=client.id, count=5, status="PENDING")
    assert len(queue_rows()) == 5
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # TRUNCATE refuses pending checks
        cursor.execute("TRUNCATE notification CASCADE")
    assert queue_rows() == []
    NotificationFactory(client=client)
    assert_queue_mirrors_the_record()


@pytest.mark.django_db(transaction=True)
def test_vacuum_leaves_the_hot_tables_their_empty_pages(database_url):
    """VACUUM gives a table's empty last pages back under an ACCESS EXCLUSIVE lock, which every
    create, claim and finish would wait for (up to a second, when autovacuum does it). The queue
    empties after every drain; VACUUM then leaves its size as it was. The rate-limit and
    throttle window tables, whose rows come and go just as fast, and the webhook queue, which
    every finish's outbox writes, are set the same way."""
    client = ClientFactory()
    notifications_insert_bulk(client_id=client.id, count=3000, status="PENDING")
    Notification.objects.filter(client=client).update(status=Status.SENT)  # they leave the queue
    with psycopg.connect(database_url, autocommit=True) as conn:
        before = conn.execute("SELECT pg_relation_size('notification_queue')").fetchone()[0]
        assert conn.execute("SELECT count(*) FROM notification_queue").fetchone()[0] == 0
        conn.execute("VACUUM notification_queue")
        after = conn.execute("SELECT pg_relation_size('notification_queue')").fetchone()[0]
        kept = conn.execute(
            "SELECT relname FROM pg_class WHERE 'vacuum_truncate=false' = ANY (reloptions)"
        ).fetchall()
    assert before > 8192 * 10
    assert after == before
    assert {name for (name,) in kept} == {
        "notification_queue",
        "ratelimit_delivery",
        "clients_request_window",
        "webhook_queue",
    }


def burst_drained(client) -> None:
    """A 20,000-row burst of `client`'s, delivered: the queue keeps the pages it took."""
    notifications_insert_bulk(client_id=client.id, count=20_000, status="PENDING")
    Notification.objects.filter(client=client).update(status=Status.SENT)


def queue_vacuumed(database_url) -> tuple[int, float]:
    """VACUUM ANALYZE of the queue, as autovacuum or the worker's refresh would run it; returns
    the planner's figures for it afterwards (pages, rows)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE notification_queue")
        return conn.execute(
            "SELECT relpages, reltuples FROM pg_class WHERE relname = 'notification_queue'"
        ).fetchone()


@pytest.mark.django_db(transaction=True)
def test_after_a_burst_has_left_the_queue_a_claim_and_a_finish_scan_none_of_it(database_url):
    """A burst drained leaves the queue its pages (VACUUM does not truncate it, above) and its
    indexes their pages, around a handful of live rows. From those figures the planner
    priced a look-up of a few ids in the primary key above a read of the whole table, and
    the queue triggers' DELETE by id read every page of it on each claim, each finish and
    each deleted notification:
    32-95 ms a statement with 113 MB left by a 1,000,000-row backlog, p99 309 ms in the
    benchmark's latency run at 200/s."""
    client = ClientFactory()
    burst_drained(client)
    # What waits afterwards: a few rows (2 to about 7 gave that plan); one is deleted below.
    waiting = [NotificationFactory(client=client) for _ in range(4)]
    pages, rows = queue_vacuumed(database_url)
    assert pages > 200 and rows == 4, (pages, rows)

    DbClock().advance(1)
    with transaction.atomic():  # the counters are the transaction's
        before = table_reads("notification_queue")
        Notification.objects.filter(id=waiting[0].id).delete()  # notification_queue_deleted
        # Two other statements of the worker's that read the queue, from partial indexes.
        assert delivery.notification_next_due_in() is not None
        assert delivery.notification_reclaim_expired() == []
        claims = delivery.notification_claim_due(worker="w", limit=10, claim_timeout_s=30)
        delivery.notification_finish(
            [
                Finish(id=c.id, claim_token=c.claim_token, status="SENT", outcome="SENT")
                for c in claims
            ]
        )
        reads = table_reads_since("notification_queue", before)
    assert len(claims) == 3
    assert "notification_queue" not in reads, reads  # the table itself: no sequential scan
    assert queue_rows() == []
    assert_queue_mirrors_the_record()
    assert Notification.objects.exclude(status=Status.SENT).count() == 0


@pytest.mark.django_db(transaction=True)
def test_after_a_burst_has_left_the_queue_the_backlog_count_reads_only_its_clients_entries(
    database_url,
):
    """The API's backlog count (at most every 2 s per client and API process) in the same
    state, with four clients' rows waiting: from 2 rows up in the planner's count for the
    queue, it sorted a read of the whole table (`notification_client_pending_count`)."""
    client = ClientFactory()
    burst_drained(client)
    for waiting_client in (client, ClientFactory(), ClientFactory(), ClientFactory()):
        NotificationFactory(client=waiting_client)
    queue_vacuumed(database_url)
    with transaction.atomic():  # the counters are the transaction's
        before = table_reads("notification_queue")
        assert notifications.pending_count(client_id=client.id, limit=101) == 1
        reads = table_reads_since("notification_queue", before)
    assert reads == {"queue_client_status": (1, 1)}


def database_sessions() -> int:
    """Client sessions open on the test database, this one's included."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND backend_type = 'client backend'"
        )
        return cursor.fetchone()[0]


def queue_dead(table: str = "notification_queue") -> int:
    return delivery.queues_dead_and_live()[table].dead


def worker_after_a_drain(workers) -> tuple:
    """A client whose 20,000-row burst was drained, its dead queue rows counted in the
    statistics, and an in-process worker that has since found nothing due (dry); the worker
    vacuums nothing before that. For tests with `queue_without_autovacuum`."""
    client = ClientFactory()
    worker = worker_build()
    workers(worker)
    burst_drained(client)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")  # the deletes, counted now
    worker._maintain(time.monotonic())  # its first checks, all due at start
    assert worker.queue_vacuum.thread is None  # not yet dry: it has not claimed
    assert worker.run_once().claimed == 0
    assert queue_dead() >= 20_000
    return client, worker


@pytest.mark.django_db(transaction=True)
def test_a_worker_with_nothing_due_vacuums_the_dead_rows_a_drain_left_in_the_queue(
    workers, caplog, queue_without_autovacuum
):
    """A drained burst's rows leave the queue, but their index entries stay until VACUUM
    removes them, and every claim's walk of the (priority, client) pairs steps over them.
    Autovacuum comes round within its naptime (a minute), later while busy with large tables;
    meanwhile a claim of one row after a drain of 20,000 visited 451 pages of the queue and its
    indexes, against 17 once vacuumed. A worker that finds nothing due, and more than 10,000
    dead rows in the queue and more dead than live, vacuums it from a thread of its own
    (delivery.upkeep.QUEUE_VACUUM_DEAD_ROWS)."""
    client, worker = worker_after_a_drain(workers)

    def claim_visits() -> int:
        NotificationFactory(client=client)
        with transaction.atomic():  # the counters are the transaction's
            before = pages_visited(("notification_queue",))
            [claim] = delivery.notification_claim_due(worker="w", limit=1, claim_timeout_s=30)
            visited = pages_visited(("notification_queue",)) - before
        delivery.notification_finish([Finish(claim.id, claim.claim_token, "SENT", "SENT")])
        return visited

    left_by_the_drain = claim_visits()

    caplog.set_level("INFO", logger="notifyqueue.delivery")
    sessions = database_sessions()
    vacuum = worker.queue_vacuum.run_once()
    assert vacuum is not None
    vacuum.join(timeout=30)
    assert not vacuum.is_alive()
    # The thread's own connection is closed; its backend exits a moment after the close.
    deadline = time.monotonic() + 5
    while database_sessions() != sessions and time.monotonic() < deadline:
        time.sleep(0.02)
    assert database_sessions() == sessions
    [logged] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("queue vac")]
    assert int(re.search(r"dead_after=(\d+) ", logged)[1]) < 10, logged
    vacuumed = claim_visits()

    assert queue_dead() < 10
    assert worker.queue_vacuum.run_once() is None  # nothing left to vacuum
    assert left_by_the_drain > 200 and vacuumed < 50, (left_by_the_drain, vacuumed)


@pytest.mark.django_db(transaction=True)
def test_a_worker_with_nothing_due_vacuums_the_webhook_queue_a_burst_of_deliveries_left(
    workers, caplog, queue_without_autovacuum
):
    """The webhook sender's claim steps over the entries every delivered event left in
    webhook_queue's indexes until VACUUM, as the worker's claim does over a drained burst's:
    the same check vacuums that table too, and only that table (the history, webhook_event,
    is left to autovacuum)."""
    client = ClientFactory(webhook_url="https://hooks.example.com/")
    worker = worker_build()
    workers(worker)
    with connection.cursor() as cursor:  # 20,000 events, claimed and delivered
        cursor.execute(
            """
            INSERT INTO webhook_event (id, client_id, notification_id, status, attempt_count,
                                       occurred_at, state, delivery_attempts, next_attempt_at,
                                       created_at)
            SELECT gen_random_uuid(), %s, gen_random_uuid(), 'SENT', 1, now(), 'PENDING', 0,
                   now(), now()
            FROM generate_series(1, 20000)
            """,
            [client.id],
        )
        cursor.execute(
            "UPDATE webhook_event SET state = 'DELIVERING', claim_token = gen_random_uuid(), "
            "claim_expires_at = now() + interval '30 seconds'"
        )
        cursor.execute(
            "UPDATE webhook_event SET state = 'DELIVERED', claim_token = NULL, "
            "claim_expires_at = NULL, delivered_at = now()"
        )
        cursor.execute("SELECT pg_stat_force_next_flush()")
    assert worker.run_once().claimed == 0  # dry
    assert queue_dead("webhook_queue") >= 20_000

    def claim_visits() -> int:
        WebhookEventFactory(notification__client=client)
        with transaction.atomic():  # the counters are the transaction's
            before = pages_visited(("webhook_queue",))
            [_] = webhooks.webhook_events_claim_due(limit=1, per_client=100, claim_timeout_s=30)
            return pages_visited(("webhook_queue",)) - before

    left_by_the_deliveries = claim_visits()
    caplog.set_level("INFO", logger="notifyqueue.delivery")
    vacuum = worker.queue_vacuum.run_once()
    assert vacuum is not None
    vacuum.join(timeout=30)
    [logged] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("queue vac")]
    assert logged.startswith("queue vacuum table=webhook_queue "), logged
    assert int(re.search(r"dead_after=(\d+) ", logged)[1]) < 10, logged
    vacuumed = claim_visits()

    assert worker.queue_vacuum.run_once() is None  # nothing left to vacuum
    assert left_by_the_deliveries > 200 and vacuumed < 50, (left_by_the_deliveries, vacuumed)


@pytest.mark.django_db(transaction=True)
def test_a_worker_finding_the_queue_held_skips_its_vacuum_and_waits_before_the_next(
    workers, database_url, caplog, monkeypatch, queue_without_autovacuum
):
    """While another holds the queue (autovacuum's pass or another worker's VACUUM, which take
    the same lock), the worker's VACUUM does nothing at once instead of waiting, its log line
    says so (the dead rows are still there), and it is not tried again until
    QUEUE_VACUUM_RETRY_S has passed (a role that may not vacuum the queue, not its owner, would
    otherwise try every second)."""
    monkeypatch.setattr(delivery_upkeep, "QUEUE_VACUUM_RETRY_S", 1.0)
    caplog.set_level("INFO", logger="notifyqueue.delivery")
    _, worker = worker_after_a_drain(workers)

    with psycopg.connect(database_url) as holder:  # its transaction holds VACUUM's lock
        holder.execute("LOCK TABLE notification_queue IN SHARE UPDATE EXCLUSIVE MODE")
        skipped = worker.queue_vacuum.run_once()
        assert skipped is not None
        skipped.join(timeout=30)
        assert not skipped.is_alive()
        assert worker.queue_vacuum.run_once() is None  # not again at once
    [logged] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("queue vac")]
    assert int(re.search(r"dead_after=(\d+) ", logged)[1]) >= 20_000, logged

    time.sleep(1.1)  # the retry interval, shortened above
    vacuum = worker.queue_vacuum.run_once()
    assert vacuum is not None
    vacuum.join(timeout=30)
    assert queue_dead() < 10
