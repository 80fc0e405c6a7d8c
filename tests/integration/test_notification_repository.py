"""What only the real repository has to show on PostgreSQL: one statement per call, races
between connections, and the plans of its queries. What any implementation answers (results,
guards, domain exceptions) is test_notification_repository_contract.py's."""

from __future__ import annotations

import json
import re
import threading
import uuid
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from notifications.models import Notification, Priority
from notifications.repositories import (
    _CHOSEN_COLUMNS,
    QUERIES,
    RECORD_FIELDS,
    DuplicateRequest,
    ListFilters,
    ListPosition,
    NewNotification,
    NotificationRepository,
)
from tests.support.factories import ClientFactory
from tests.support.reads import table_reads, table_reads_since
from tests.support.statements import statements_sent

repository = NotificationRepository()


def new_notification(client_id: uuid.UUID, key: str = "k-1", **fields) -> NewNotification:
    values = {
        "client_id": client_id,
        "idempotency_key": key,
        "request_fingerprint": "f" * 64,
        "channel": "push",
        "recipient": "device-token-0001",
        "subject": "",
        "body": "Hello",
        "priority": Priority.CRITICAL,
        "metadata": {"nested": {"list": [1, 2]}},
        "user_id": None,
        "template": None,
        "payload": None,
        "fallback_channels": [],
        "max_attempts": 6,
    }
    return NewNotification(**{**values, **fields})


@pytest.mark.django_db
def test_insert_is_one_statement_whether_new_or_a_replay():
    client = ClientFactory()
    with CaptureQueriesContext(connection) as new:
        repository.insert(new=new_notification(client.id))
    with CaptureQueriesContext(connection) as replay, pytest.raises(DuplicateRequest):
        repository.insert(new=new_notification(client.id))
    assert (len(new.captured_queries), len(replay.captured_queries)) == (1, 1)


@pytest.mark.django_db
def test_insert_many_is_one_statement_with_an_answer_per_item_in_order():
    client = ClientFactory()
    old = repository.insert(new=new_notification(client.id, key="old"))
    batch = [new_notification(client.id, key=f"n-{n}", body=f"B{n}") for n in range(50)]
    batch.insert(10, new_notification(client.id, key="old", body="changed"))
    with statements_sent() as sent:
        results = repository.insert_many(client_id=client.id, new=batch)
    assert len(sent) == 1, sent
    assert [r.record.idempotency_key for r in results] == [n.idempotency_key for n in batch]
    assert [r.created for r in results] == [True] * 10 + [False] + [True] * 40
    assert results[10].record == old
    assert [r.record.body for r in results[11:]] == [f"B{n}" for n in range(10, 50)]
    assert results[0].record.metadata == {"nested": {"list": [1, 2]}}
    assert Notification.objects.filter(client_id=client.id).count() == 51


@pytest.mark.django_db
def test_insert_many_of_nothing_runs_no_statement():
    client = ClientFactory()
    with statements_sent() as sent:
        assert repository.insert_many(client_id=client.id, new=[]) == []
    assert sent == []


@pytest.mark.django_db
def test_the_checked_create_answers_what_the_database_chose_in_order():
    # Read by position (_insert_checked): the columns _record_created takes, in its order,
    # are the function's answer. A key that is not the client's: no row.
    params = dict.fromkeys(re.findall(r"%\((\w+)\)s", QUERIES["notification_create_checked"]), None)
    params.update(client_id=ClientFactory().id, idempotency_key="k-1", key_prefix="none")
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["notification_create_checked"], params)
        assert cursor.fetchall() == []
        assert tuple(column.name for column in cursor.description) == _CHOSEN_COLUMNS
    assert set(_CHOSEN_COLUMNS) <= set(RECORD_FIELDS)


@pytest.mark.django_db(transaction=True)
def test_an_insert_racing_an_uncommitted_one_waits_and_gets_duplicate_request():
    client = ClientFactory()
    inserted, release = threading.Event(), threading.Event()
    holder: dict = {}

    def first_request() -> None:
        try:
            with transaction.atomic():
                holder["record"] = repository.insert(new=new_notification(client.id))
                inserted.set()
                release.wait(timeout=30)
        finally:
            connection.close()

    def second_request() -> None:
        try:
            repository.insert(new=new_notification(client.id))
        except DuplicateRequest as duplicate:
            holder["duplicate"] = duplicate.existing
        finally:
            connection.close()

    first = threading.Thread(target=first_request)
    first.start()
    assert inserted.wait(timeout=30)
    second = threading.Thread(target=second_request)
    second.start()
    second.join(timeout=0.3)
    assert second.is_alive(), "the second insert should wait for the first to commit"
    release.set()
    first.join(timeout=30)
    second.join(timeout=30)
    assert holder["duplicate"] == holder["record"]


@pytest.mark.django_db(transaction=True)
def test_a_batch_racing_an_uncommitted_insert_answers_that_row_for_its_key():
    client = ClientFactory()
    inserted, release = threading.Event(), threading.Event()
    holder: dict = {}

    def single_request() -> None:
        try:
            with transaction.atomic():
                holder["record"] = repository.insert(new=new_notification(client.id, key="k-2"))
                inserted.set()
                release.wait(timeout=30)
        finally:
            connection.close()

    def batch_request() -> None:
        try:
            keys = ["k-1", "k-2", "k-3"]
            holder["batch"] = repository.insert_many(
                client_id=client.id, new=[new_notification(client.id, key=k) for k in keys]
            )
        finally:
            connection.close()

    first = threading.Thread(target=single_request)
    first.start()
    assert inserted.wait(timeout=30)
    second = threading.Thread(target=batch_request)
    second.start()
    second.join(timeout=0.3)
    assert second.is_alive(), "the batch should wait for the conflicting insert to commit"
    release.set()
    first.join(timeout=30)
    second.join(timeout=30)
    assert [r.created for r in holder["batch"]] == [True, False, True]
    assert holder["batch"][1].record == holder["record"]


INSERT_ROWS = """
    INSERT INTO notification (id, client_id, idempotency_key, request_fingerprint,
        channel, recipient, subject, body, priority, metadata, fallback_channels,
        status, send_at, due_at, attempt_count, max_attempts, operator_retries,
        created_at, updated_at)
    SELECT notifyqueue_uuid7(), %(client_id)s, %(key_prefix)s || n, '', 'email',
           coalesce(%(recipient)s, 'u' || n || '@example.com'),
           '', 'x', 2, '{}', '[]', 'PENDING', now(), now(), 0, 6, 0,
           now() - n * interval '1 second', now() - n * interval '1 second'
      FROM generate_series(1, %(count)s) AS n
"""


def insert_pending_rows(
    client_id: uuid.UUID, count: int, *, recipient: str | None = None, key_prefix: str = "bulk-"
) -> None:
    """`count` rows, each for its own recipient unless one is given."""
    params = {"client_id": client_id, "count": count, "recipient": recipient}
    with connection.cursor() as cursor:
        cursor.execute(INSERT_ROWS, {**params, "key_prefix": key_prefix})
        cursor.execute("ANALYZE notification")


def explain(sql: str, params=None, *, analyze: bool = False) -> dict:
    options = "ANALYZE, FORMAT JSON" if analyze else "FORMAT JSON"
    with connection.cursor() as cursor:
        # Tiny test tables make sequential scans cheapest; the question is whether an index
        # serves the query at all, as it must once the table is large.
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"EXPLAIN ({options}) {sql}", params)
        (plan,) = cursor.fetchone()
    return (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]


def nodes(plan: dict):
    """The plan's nodes, each partition's index named as the parent's index it belongs to
    (`<index>_<yyyymmdd>` for a week's partition, `d_<index>` for the default partition)."""
    if "Index Name" in plan:
        plan = {**plan, "Index Name": re.sub(r"^d_|_\d{8}$", "", plan["Index Name"])}
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


@pytest.mark.django_db
def test_pending_count_reads_an_index_and_no_more_than_limit_rows():
    client = ClientFactory()
    insert_pending_rows(client.id, 3000)
    # Other clients' backlogs, which the count must not read, and the queue table's statistics
    # (not whatever an earlier test left: with an empty queue's, the planner collected every
    # row in a bitmap; with one client only, any index of the queue is as good).
    insert_pending_rows(ClientFactory().id, 20_000)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE notification_queue")
    with transaction.atomic():  # the counters are the transaction's
        before = table_reads("notification_queue")
        assert repository.pending_count(client_id=client.id, limit=101) == 101
        reads = table_reads_since("notification_queue", before)
    assert set(reads) == {"queue_client_status"}  # neither the table nor another index
    scans, entries = reads["queue_client_status"]
    assert scans == 1 and entries <= 101


def list_query_sql(**kwargs) -> str:
    kwargs = {"after": None, "before": None, **kwargs}
    with CaptureQueriesContext(connection) as captured:
        repository.list_page(limit=50, **kwargs)
    (query,) = captured.captured_queries
    return query["sql"]


@pytest.fixture
def two_busy_clients(db) -> tuple[uuid.UUID, uuid.UUID]:
    """Enough rows, with statistics, for the planner to choose as it would in production."""
    busy, other = ClientFactory(), ClientFactory()
    insert_pending_rows(busy.id, 4000)
    insert_pending_rows(other.id, 4000)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE notification SET status = 'SENT' WHERE random() < 0.8")
        cursor.execute("ANALYZE notification")
        cursor.execute("ANALYZE notification_queue")
    return busy.id, other.id


@pytest.mark.parametrize(
    "filters, indexes",
    [
        (ListFilters(), {"notification_client_list"}),
        # By status: the queue table's, by client or (the planner's choice when the client's
        # rows are a large share of that status) across clients filtered by client.
        (ListFilters(status="PENDING"), {"queue_client_status", "queue_status"}),
        (ListFilters(recipient="u7@example.com"), {"notification_recipient"}),
    ],
)
def test_client_list_queries_use_an_index(two_busy_clients, filters, indexes):
    with transaction.atomic():
        plan = explain(list_query_sql(client_id=two_busy_clients[0], filters=filters))
    assert indexes & {node.get("Index Name") for node in nodes(plan)}
    assert "Seq Scan" not in {node["Node Type"] for node in nodes(plan)}


@pytest.mark.parametrize(
    "filters",
    [
        ListFilters(),
        ListFilters(status="SENT"),
        ListFilters(status="PENDING"),
        ListFilters(recipient="u7@example.com"),
    ],
)
def test_client_list_pages_come_off_the_index_in_order(two_busy_clients, filters):
    with transaction.atomic():
        plan = explain(list_query_sql(client_id=two_busy_clients[0], filters=filters))
    assert "Sort" not in {node["Node Type"] for node in nodes(plan)}


def test_operator_list_reads_the_recent_index_without_sorting(two_busy_clients):
    with transaction.atomic():
        plan = explain(list_query_sql(client_id=None, filters=ListFilters()))
    assert "notification_recent" in {node.get("Index Name") for node in nodes(plan)}
    assert "Sort" not in {node["Node Type"] for node in nodes(plan)}


@pytest.mark.parametrize("direction", ["after", "before"])
def test_a_cursor_page_starts_inside_the_index(two_busy_clients, direction):
    position = ListPosition(created_at=timezone.now() - timedelta(seconds=2000), id=uuid.uuid4())
    sql = list_query_sql(
        client_id=two_busy_clients[0], filters=ListFilters(), **{direction: position}
    )
    with transaction.atomic():
        plan = explain(sql)
    scan = next(node for node in nodes(plan) if node.get("Index Name"))
    assert scan["Index Name"] == "notification_client_list"
    assert "created_at" in scan["Index Cond"]
    assert "Sort" not in {node["Node Type"] for node in nodes(plan)}


def blocks_to_insert_one_row(client_id: uuid.UUID, recipient: str) -> int:
    """Buffers an insert of one row for `recipient` touched: the heap's and every index's."""
    with connection.cursor() as cursor:
        cursor.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + INSERT_ROWS,
            {
                "client_id": client_id,
                "count": 1,
                "recipient": recipient,
                "key_prefix": f"{recipient}-{uuid.uuid4()}-",
            },
        )
        (plan,) = cursor.fetchone()
    top = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
    return top["Shared Hit Blocks"] + top["Shared Read Blocks"]


@pytest.mark.django_db
def test_a_create_for_a_recipient_with_a_long_history_costs_what_a_new_recipients_does():
    """A hash index on `recipient` kept one recipient's entries in one bucket, and each insert
    walked that bucket's pages to one with room: a create cost more the more rows its recipient
    already had (a frequent address, a monitoring inbox, one push token). The recipient's
    digest index is a btree: an insert descends it, whatever the recipient's history."""
    client = ClientFactory()
    insert_pending_rows(client.id, 20_000, recipient="frequent@example.com")
    blocks_warm = blocks_to_insert_one_row(client.id, "warm-up@example.com")
    # The least of three each: a heap insert now and then tries pages its free space map
    # remembered with room and finds them full (an autovacuum of other tests' rows), ~30 more.
    blocks_frequent = min(
        blocks_to_insert_one_row(client.id, "frequent@example.com") for _ in range(3)
    )
    blocks_new = min(blocks_to_insert_one_row(client.id, f"new-{n}@example.com") for n in range(3))
    # The hash index touched ~50 more buffers here (20,000 entries, ~400 to a page).
    assert blocks_warm > 0
    assert blocks_frequent <= blocks_new + 3
