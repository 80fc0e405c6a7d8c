"""The notification table partitioned by week of creation: weeks added ahead by the worker's
upkeep (rows of a week that fell into the default partition move into it), one row per
(client, key) across weeks, even for two creates straddling the start of a week, and retention
that drops a week whole, never while a row of it waits."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from io import StringIO

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection

from delivery.repositories import DeliveryRepository
from delivery.upkeep import HistoryPartitions
from notifications.models import Notification, NotificationQueue, Status
from notifyqueue.history import uuid7
from tests.support.clock import DbClock, database_now
from tests.support.factories import ClientFactory, NotificationFactory
from tests.support.webhook_factories import WebhookEventFactory
from webhooks.models import DeliveryState

pytestmark = pytest.mark.django_db

# A copy of a notification under a new key, made as the create statements make a row: id and
# creation time from the database clock, ON CONFLICT DO NOTHING.
COPY_AS_CREATED = """
INSERT INTO notification
SELECT (jsonb_populate_record(n, jsonb_build_object(
            'id', notifyqueue_uuid7(), 'created_at', notifyqueue_now(),
            'updated_at', notifyqueue_now(), 'idempotency_key', %(key)s::text))).*
  FROM notification AS n WHERE n.id = %(template)s
ON CONFLICT DO NOTHING
RETURNING id
"""


def week_of(notification_id) -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tableoid::regclass::text FROM notification WHERE id = %s", [notification_id]
        )
        return cursor.fetchone()[0]


def exists(table: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [table])
        return cursor.fetchone()[0]


def prune(*args: str) -> str:
    # The rows this test's transaction wrote had their deferred foreign keys checked at commit
    # (a table with pending checks is not dropped); a run of the command has none.
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    out = StringIO()
    call_command("prune_notifications", *args, stdout=out)
    return out.getvalue()


def test_a_create_lands_in_the_partition_of_its_week_by_the_database_clock():
    template = NotificationFactory()
    with connection.cursor() as cursor:
        cursor.execute(COPY_AS_CREATED, {"key": "now", "template": template.id})
        (created,) = cursor.fetchone()
        cursor.execute(
            "SELECT to_char(history_week(notifyqueue_now()) AT TIME ZONE 'UTC', 'YYYYMMDD')"
        )
        (week,) = cursor.fetchone()
    assert week_of(created) == f"notification_{week}"


def test_the_upkeep_adds_weeks_ahead_and_moves_their_rows_out_of_the_default_partition():
    """A database clock moved five weeks ahead: the rows made then land in the default
    partition (no week of theirs yet); the upkeep adds their week and moves them into it,
    queue copy and all."""
    clock = DbClock()
    clock.advance(timedelta(weeks=5).total_seconds())
    template = NotificationFactory()
    with connection.cursor() as cursor:
        cursor.execute(COPY_AS_CREATED, {"key": "ahead", "template": template.id})
        (ahead,) = cursor.fetchone()
    assert week_of(ahead) == "notification_default"

    added = HistoryPartitions(repository=DeliveryRepository(), worker_id="w").run_once()

    assert added  # this week's and the ones after it, five weeks on
    assert week_of(ahead) in added
    assert Notification.objects.get(id=ahead).idempotency_key == "ahead"
    assert NotificationQueue.objects.filter(notification_id=ahead, status=Status.PENDING).exists()
    assert HistoryPartitions(repository=DeliveryRepository(), worker_id="w").run_once() == []


def test_a_key_used_in_an_earlier_week_is_a_replay_in_a_later_one():
    template = NotificationFactory(idempotency_key="template")
    with connection.cursor() as cursor:
        cursor.execute(COPY_AS_CREATED, {"key": "order-7", "template": template.id})
        (first,) = cursor.fetchone()
        clock = DbClock()
        clock.advance(timedelta(weeks=1).total_seconds())
        HistoryPartitions(repository=DeliveryRepository(), worker_id="w").run_once()
        cursor.execute(COPY_AS_CREATED, {"key": "order-7", "template": template.id})
        assert cursor.fetchall() == []
    assert list(
        Notification.objects.filter(client=template.client, idempotency_key="order-7").values_list(
            "id", flat=True
        )
    ) == [first]


@pytest.mark.django_db(transaction=True)
def test_two_creates_of_one_key_straddling_the_start_of_a_week_make_one_row(database_url):
    """The first create's id falls in the last second of a week and its transaction stays open
    past the week's start; the second, made in the new week, lands in another partition, where
    no unique index sees the first. Inside five minutes of a week's start a client's creates
    take turns: the second waits for the first's commit, then finds its key taken."""
    template = NotificationFactory(idempotency_key="template")
    real = database_now()
    with connection.cursor() as cursor:
        cursor.execute("SELECT history_week(notifyqueue_now()) + interval '7 days'")
        (week_start,) = cursor.fetchone()
        # The database clock runs, 1.5 s before the next week's start.
        offset = week_start - real - timedelta(seconds=1.5)
        cursor.execute(
            "CREATE OR REPLACE FUNCTION notifyqueue_now() RETURNS timestamptz LANGUAGE sql "
            "STABLE PARALLEL SAFE AS $$ SELECT statement_timestamp() + "
            f"interval '{offset.total_seconds()} s' $$"
        )
        DbClock.installed = True
    params = {"key": "straddle", "template": template.id}
    second: list = []
    with psycopg.connect(database_url) as first_conn, psycopg.connect(database_url) as second_conn:
        with first_conn.transaction():
            (first_id,) = first_conn.execute(COPY_AS_CREATED, params).fetchone()
            time.sleep(2.0)  # past the week's start, still uncommitted

            def create_second() -> None:
                with second_conn.transaction():
                    second.extend(second_conn.execute(COPY_AS_CREATED, params).fetchall())

            racer = threading.Thread(target=create_second)
            racer.start()
            racer.join(timeout=1.0)
            assert racer.is_alive()  # waiting for the first's commit
        racer.join(timeout=10)
    assert second == []
    rows = Notification.objects.filter(client=template.client, idempotency_key="straddle")
    assert list(rows.values_list("id", flat=True)) == [first_id]


def test_a_week_that_ended_before_the_cutoff_is_dropped_whole():
    client = ClientFactory()
    sent = NotificationFactory(client=client, status=Status.SENT, attempt_count=1)
    dead = NotificationFactory(client=client, status=Status.DEAD_LETTERED, attempt_count=6)
    cancelled = NotificationFactory(client=client, status=Status.CANCELLED)
    week = week_of(sent.id)
    assert week != "notification_default" and week_of(dead.id) == week_of(cancelled.id) == week
    DbClock().advance(timedelta(days=45).total_seconds())

    output = prune("--older-than", "30d")

    assert f"week {week}: dropped (3 notification(s))" in output
    assert not exists(week)
    assert not Notification.objects.filter(client=client).exists()
    assert not NotificationQueue.objects.filter(client_id=client.id).exists()


def test_a_week_with_a_row_still_waiting_stays_whole():
    client = ClientFactory()
    sent = NotificationFactory(client=client, status=Status.SENT, attempt_count=1)
    waiting = NotificationFactory(client=client)  # PENDING: scheduled far ahead, say
    week = week_of(sent.id)
    DbClock().advance(timedelta(days=45).total_seconds())

    output = prune("--older-than", "30d")

    assert f"week {week}: kept: a notification of it still waits or reports" in output
    assert exists(week)
    assert set(Notification.objects.filter(client=client).values_list("id", flat=True)) == {
        sent.id,
        waiting.id,
    }


def test_a_row_retried_by_an_operator_before_the_drop_keeps_its_week():
    """The drop checks again under its lock: a dead letter retried since the week was found
    free keeps the week (and its queue copy)."""
    dead = NotificationFactory(status=Status.DEAD_LETTERED, attempt_count=6)
    week = week_of(dead.id)
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute("UPDATE notification SET status = 'PENDING' WHERE id = %s", [dead.id])
        cursor.execute("SELECT notification_week_drop(%s::regclass)", [week])
        assert cursor.fetchone() == (False,)
    assert exists(week)
    assert NotificationQueue.objects.filter(notification_id=dead.id, status=Status.PENDING).exists()


def test_a_python_made_id_lands_in_the_week_of_its_time():
    at = database_now() + timedelta(weeks=1)
    HistoryPartitions(repository=DeliveryRepository(), worker_id="w").run_once()
    row = NotificationFactory(id=uuid7(at))
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_char(history_week(%s) AT TIME ZONE 'UTC', 'YYYYMMDD')", [at])
        (week,) = cursor.fetchone()
    assert week_of(row.id) == f"notification_{week}"


def test_a_week_with_a_webhook_still_to_deliver_stays_whole():
    client = ClientFactory()
    sent = NotificationFactory(client=client, status=Status.SENT, attempt_count=1)
    WebhookEventFactory(notification=sent, state=DeliveryState.PENDING)
    week = week_of(sent.id)
    DbClock().advance(timedelta(days=45).total_seconds())

    output = prune("--older-than", "30d")

    assert f"week {week}: kept: a notification of it still waits or reports" in output
    assert Notification.objects.filter(id=sent.id).exists()


@pytest.mark.django_db(transaction=True)
def test_a_drop_that_cannot_get_its_lock_in_time_keeps_the_week_for_the_next_run(database_url):
    """Another session holds the table (a long report, say): the drop gives up after its
    lock_timeout instead of queueing every create and claim behind it, and the next run,
    with the table free, drops the week."""
    sent = NotificationFactory(status=Status.SENT, attempt_count=1)
    week = week_of(sent.id)
    DbClock().advance(timedelta(days=45).total_seconds())
    with psycopg.connect(database_url) as other, other.transaction():
        other.execute("LOCK TABLE notification IN ACCESS SHARE MODE")
        started = time.monotonic()
        output = prune("--older-than", "30d")
        waited = time.monotonic() - started
    assert f"week {week}: kept: the table was busy, the next run tries again" in output
    assert waited < 5
    assert exists(week)
    assert f"week {week}: dropped (1 notification(s))" in prune("--older-than", "30d")
    assert not exists(week)
