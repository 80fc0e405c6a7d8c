"""What a caller of the notification repository may rely on, checked on both implementations.

The services' unit tests run over an in-memory stand-in (`tests/support/fake_repository.py`);
production runs `NotificationRepository` on PostgreSQL. Every test here runs on each, so the
stand-in cannot drift from the real one: the same answers and types, the same domain
exceptions, the same edge cases (a used key, another client's row, a row in the wrong status,
limits). Where they differ, the real one is right.

A row in a state only the worker makes (PROCESSING, SENT, FAILED, ...) is set up by
`force`, which writes the row as the worker's statements would leave it. The database clock is
frozen at `T0` and moved by hand (`clock_at`); the `now` a caller passes is its own clock,
which the tests keep apart from the database's so that a mix-up shows.

The real repository's own concerns (one statement per call, races between connections, query
plans) are tested in test_notification_repository.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import transaction

from notifications.models import Notification, Priority, Status
from notifications.repositories import (
    DuplicateRequest,
    Inserted,
    ListFilters,
    ListPage,
    ListPosition,
    NewNotification,
    NotificationRecord,
    NotificationRepository,
    RetriedRow,
)
from notifyqueue.errors import InvalidRequest
from tests.support.clock import DbClock
from tests.support.factories import ClientFactory
from tests.support.fake_repository import InMemoryNotificationRepository

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
# An operator's or API process's clock, off from the database's: what the caller passes as `now`.
CALLER_SKEW = timedelta(seconds=7)
NOT_PENDING = [status for status in Status.values if status != "PENDING"]
NOT_RETRYABLE = [status for status in Status.values if status not in ("FAILED", "DEAD_LETTERED")]


class InMemoryStore:
    def __init__(self) -> None:
        self.repository = InMemoryNotificationRepository()

    def clock_at(self, when: datetime) -> None:
        self.repository.now = when

    def new_client(self) -> uuid.UUID:
        return uuid.uuid4()

    def force(self, notification_id: uuid.UUID, **columns) -> None:
        rows = self.repository.rows
        rows[notification_id] = dataclasses.replace(rows[notification_id], **columns)

    def savepoint(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


class PostgresStore:
    def __init__(self) -> None:
        self.repository = NotificationRepository()
        self._clock: DbClock | None = None

    def clock_at(self, when: datetime) -> None:
        if self._clock is None:
            self._clock = DbClock(when)
        else:
            self._clock.now = when

    def new_client(self) -> uuid.UUID:
        return ClientFactory().id

    def force(self, notification_id: uuid.UUID, **columns) -> None:
        if columns.get("status") == "PROCESSING":
            # The table holds a PROCESSING row to its claim.
            columns.update(
                claim_token=uuid.uuid4(),
                claimed_by="contract-worker",
                claim_expires_at=T0 + timedelta(hours=1),
            )
        assert Notification.objects.filter(id=notification_id).update(**columns) == 1

    def savepoint(self) -> contextlib.AbstractContextManager:
        # A statement PostgreSQL refused aborts the transaction it ran in: the test's
        # transaction goes on from here, as the next request's would.
        return transaction.atomic()


@pytest.fixture(
    params=[
        pytest.param(InMemoryStore, id="in_memory"),
        pytest.param(PostgresStore, id="postgresql", marks=pytest.mark.django_db),
    ]
)
def store(request) -> InMemoryStore | PostgresStore:
    made = request.param()
    made.clock_at(T0)
    return made


def new(client_id: uuid.UUID, key: str = "k-1", **fields) -> NewNotification:
    values = {
        "client_id": client_id,
        "idempotency_key": key,
        "request_fingerprint": "f" * 64,
        "channel": "push",
        "recipient": "device-token-0001",
        "subject": "",
        "body": "Hello",
        "priority": Priority.NORMAL,
        "metadata": {},
        "user_id": None,
        "template": None,
        "payload": None,
        "fallback_channels": [],
        "max_attempts": 6,
    }
    return NewNotification(**{**values, **fields})


def insert_at(store, when: datetime, client_id: uuid.UUID, key: str, **fields):
    store.clock_at(when)
    return store.repository.insert(new=new(client_id, key, **fields))


def stored(store, record: NotificationRecord) -> NotificationRecord | None:
    return store.repository.get(notification_id=record.id, client_id=None)


def newest_first(records) -> list[NotificationRecord]:
    return sorted(records, key=lambda r: (r.created_at, r.id), reverse=True)


def oldest_first(records) -> list[NotificationRecord]:
    return sorted(records, key=lambda r: (r.created_at, r.id))


# Inserting and reading back


def test_insert_answers_the_new_row_as_get_reads_it(store):
    client = store.new_client()
    asked = new(
        client,
        channel="email",
        recipient="ada@example.com",
        subject="Hi",
        body="Your code is 123456",
        priority=Priority.CRITICAL,
        metadata={"nested": {"list": [1, 2]}, "order": 17},
        user_id="user-7",
        template="welcome",
        payload={"name": "Ada"},
        fallback_channels=["sms", "push"],
        max_attempts=4,
    )
    record = store.repository.insert(new=asked)

    assert type(record) is NotificationRecord
    assert isinstance(record.id, uuid.UUID)
    assert type(record.status) is str and record.status == "PENDING"
    assert record.priority is Priority.CRITICAL
    expected = dataclasses.asdict(asked)
    del expected["delay_seconds"], expected["ttl_seconds"]
    del expected["digest_key"], expected["digest_window_seconds"], expected["digest_at"]
    expected.update(
        id=record.id,
        status="PENDING",
        send_at=T0,
        due_at=T0,
        attempt_count=0,
        last_error=None,
        sent_at=None,
        operator_retries=0,
        created_at=T0,
        updated_at=T0,
        last_retried_at=None,
        last_retried_by=None,
        rate_deferred_from=None,
        circuit_held_since=None,
        quiet_held_since=None,
        receipt=None,
        digest_bucket_id=None,
        digest_closes_at=None,
        digest_id=None,
    )
    assert dataclasses.asdict(record) == expected
    assert store.repository.get(notification_id=record.id, client_id=client) == record
    assert (
        store.repository.get_by_idempotency_key(client_id=client, idempotency_key="k-1") == record
    )


@pytest.mark.parametrize(
    "timing, due",
    [
        ({}, T0),
        ({"delay_seconds": 90}, T0 + timedelta(seconds=90)),
        (
            {"send_at": T0 + timedelta(hours=2, microseconds=5)},
            T0 + timedelta(hours=2, microseconds=5),
        ),
        ({"send_at": T0 - timedelta(days=400)}, T0),
        ({"send_at": T0}, T0),
    ],
)
def test_send_and_due_times_come_from_the_database_clock(store, timing, due):
    client = store.new_client()
    single = store.repository.insert(new=new(client, "single", **timing))
    (batched,) = store.repository.insert_many(
        client_id=client, new=[new(client, "batch", **timing)]
    )
    for record in (single, batched.record):
        assert (record.send_at, record.due_at) == (due, due)
        assert (record.created_at, record.updated_at) == (T0, T0)


def test_a_used_key_raises_duplicate_request_with_the_row_that_holds_it(store):
    client = store.new_client()
    first = store.repository.insert(new=new(client))
    store.clock_at(T0 + timedelta(minutes=5))

    with pytest.raises(DuplicateRequest) as caught:
        store.repository.insert(new=new(client, body="changed", request_fingerprint="0" * 64))

    assert caught.value.existing == first
    assert store.repository.get_by_idempotency_key(client_id=client, idempotency_key="k-1") == first
    page = store.repository.list_page(
        client_id=client, filters=ListFilters(), after=None, before=None, limit=10
    )
    assert page.records == [first]


def test_an_idempotency_key_is_the_clients_own(store):
    first, second = store.new_client(), store.new_client()
    mine = store.repository.insert(new=new(first))
    theirs = store.repository.insert(new=new(second))
    assert mine.id != theirs.id
    assert (
        store.repository.get_by_idempotency_key(client_id=second, idempotency_key="k-1") == theirs
    )


@pytest.mark.parametrize("breaking", [{"channel": "pigeon"}, {"max_attempts": -1}])
def test_a_row_that_breaks_a_table_rule_is_invalid_request_and_stores_nothing(store, breaking):
    client = store.new_client()
    with pytest.raises(InvalidRequest), store.savepoint():
        store.repository.insert(new=new(client, "single", **breaking))
    with pytest.raises(InvalidRequest), store.savepoint():
        store.repository.insert_many(
            client_id=client, new=[new(client, "fine"), new(client, "bad", **breaking)]
        )
    page = store.repository.list_page(
        client_id=client, filters=ListFilters(), after=None, before=None, limit=10
    )
    assert page == ListPage(records=[], has_more=False)


def test_insert_many_answers_each_item_in_its_order_new_or_the_row_holding_its_key(store):
    client = store.new_client()
    held = store.repository.insert(new=new(client, "held", body="first"))
    store.clock_at(T0 + timedelta(seconds=30))
    batch = [
        new(client, "n-0", body="B0", metadata={"n": 0}),
        new(client, "held", body="changed"),
        new(client, "n-1", body="B1", priority=Priority.HIGH, fallback_channels=["sms"]),
    ]

    results = store.repository.insert_many(client_id=client, new=batch)

    assert all(type(result) is Inserted for result in results)
    assert [r.created for r in results] == [True, False, True]
    assert [r.record.idempotency_key for r in results] == ["n-0", "held", "n-1"]
    assert results[1].record == held
    for result, asked in zip(results[::2], batch[::2], strict=True):
        record = result.record
        assert type(record) is NotificationRecord and type(record.status) is str
        assert (record.body, record.priority, record.metadata, record.fallback_channels) == (
            asked.body,
            asked.priority,
            asked.metadata,
            asked.fallback_channels,
        )
        assert (record.status, record.created_at, record.due_at) == (
            "PENDING",
            T0 + timedelta(seconds=30),
            T0 + timedelta(seconds=30),
        )
        assert store.repository.get(notification_id=record.id, client_id=client) == record


def test_insert_many_of_nothing_answers_nothing(store):
    assert store.repository.insert_many(client_id=store.new_client(), new=[]) == []


def test_insert_many_refuses_a_key_twice_and_stores_nothing(store):
    client = store.new_client()
    with pytest.raises(ValueError):
        store.repository.insert_many(
            client_id=client, new=[new(client, "a"), new(client, "b"), new(client, "a")]
        )
    assert store.repository.get_by_idempotency_key(client_id=client, idempotency_key="b") is None


def test_get_answers_the_clients_own_row_or_any_row_without_a_client(store):
    owner, other = store.new_client(), store.new_client()
    record = store.repository.insert(new=new(owner))

    assert store.repository.get(notification_id=record.id, client_id=owner) == record
    assert store.repository.get(notification_id=record.id, client_id=other) is None
    assert store.repository.get(notification_id=record.id, client_id=None) == record
    assert store.repository.get(notification_id=uuid.uuid4(), client_id=None) is None


def test_get_by_idempotency_key_answers_nothing_for_an_unused_key(store):
    client = store.new_client()
    store.repository.insert(new=new(client, "used"))
    found = store.repository.get_by_idempotency_key
    assert found(client_id=client, idempotency_key="unused") is None
    assert found(client_id=store.new_client(), idempotency_key="used") is None


# Listing


def rows_over_time(store, client: uuid.UUID, count: int = 7) -> list[NotificationRecord]:
    """`count` rows one second apart, but rows 2 to 4 created at the same instant (the order
    then falls to their ids)."""
    offsets = [0, 1, 2, 2, 2, 3, 4, 5, 6][:count]
    return [
        insert_at(store, T0 + timedelta(seconds=offset), client, f"row-{n}")
        for n, offset in enumerate(offsets)
    ]


def page_of(store, client_id, *, after=None, before=None, limit=100, **filters) -> ListPage:
    return store.repository.list_page(
        client_id=client_id,
        filters=ListFilters(**filters),
        after=after,
        before=before,
        limit=limit,
    )


def position(record: NotificationRecord) -> ListPosition:
    return ListPosition(created_at=record.created_at, id=record.id)


def test_a_page_is_newest_first_and_ties_fall_to_the_id(store):
    client = store.new_client()
    expected = newest_first(rows_over_time(store, client))

    assert page_of(store, client) == ListPage(records=expected, has_more=False)
    assert page_of(store, client, limit=len(expected)) == ListPage(expected, has_more=False)
    assert page_of(store, client, limit=len(expected) - 1) == ListPage(expected[:-1], True)
    assert page_of(store, client, limit=1) == ListPage(expected[:1], has_more=True)
    assert page_of(store, client, limit=0) == ListPage(records=[], has_more=True)


def test_pages_walk_older_with_after_and_newer_with_before(store):
    client = store.new_client()
    expected = newest_first(rows_over_time(store, client))

    pages = [page_of(store, client, limit=2)]
    while pages[-1].has_more:
        pages.append(page_of(store, client, after=position(pages[-1].records[-1]), limit=2))
    assert [page.records for page in pages] == [
        expected[i : i + 2] for i in range(0, len(expected), 2)
    ]

    back = [page_of(store, client, before=position(pages[-1].records[0]), limit=2)]
    while back[-1].has_more:
        back.append(page_of(store, client, before=position(back[-1].records[0]), limit=2))
    # Each page newest first; has_more says whether newer rows lie beyond it.
    assert [page.records for page in back] == [expected[4:6], expected[2:4], expected[0:2]]
    assert [page.has_more for page in back] == [True, True, False]


def test_a_position_between_rows_and_beyond_every_row(store):
    client = store.new_client()
    expected = newest_first(rows_over_time(store, client))
    between = ListPosition(created_at=T0 + timedelta(seconds=2, milliseconds=500), id=uuid.uuid4())
    newest = ListPosition(created_at=T0 + timedelta(days=1), id=uuid.uuid4())
    oldest = ListPosition(created_at=T0 - timedelta(days=1), id=uuid.uuid4())

    assert page_of(store, client, after=between).records == expected[2:]
    assert page_of(store, client, before=between).records == expected[:2]
    assert page_of(store, client, before=between, limit=1) == ListPage(expected[1:2], True)
    assert page_of(store, client, after=newest).records == expected
    assert page_of(store, client, after=oldest) == ListPage(records=[], has_more=False)
    assert page_of(store, client, before=newest) == ListPage(records=[], has_more=False)


def test_a_page_holds_the_clients_own_rows_and_every_clients_without_one(store):
    mine, theirs = store.new_client(), store.new_client()
    my_rows = [insert_at(store, T0 + timedelta(seconds=n), mine, f"m-{n}") for n in range(3)]
    their_rows = [
        insert_at(store, T0 + timedelta(seconds=n, milliseconds=5), theirs, f"t-{n}")
        for n in range(3)
    ]

    assert page_of(store, mine).records == newest_first(my_rows)
    assert page_of(store, theirs).records == newest_first(their_rows)
    # Any other rows in the table are older than T0: ours come first.
    everyone = page_of(store, None, limit=6).records
    assert everyone == newest_first(my_rows + their_rows)


def test_filters_narrow_a_page_and_keep_its_order(store):
    client = store.new_client()
    kinds = [
        {"status": "PENDING", "channel": "email", "recipient": "a@example.com"},
        {"status": "SENT", "channel": "email", "recipient": "a@example.com"},
        {"status": "FAILED", "channel": "sms", "recipient": "+4915100000001"},
        {"status": "CANCELLED", "channel": "email", "recipient": "b@example.com"},
        {"status": "PENDING", "channel": "push", "recipient": "device-token-0001"},
        {"status": "DEAD_LETTERED", "channel": "email", "recipient": "a@example.com"},
        {"status": "SENT", "channel": "sms", "recipient": "+4915100000001"},
    ]
    rows = []
    for n, kind in enumerate(kinds):
        priority = Priority.HIGH if n % 3 == 0 else Priority.NORMAL
        made = insert_at(
            store,
            T0 + timedelta(seconds=n),
            client,
            f"k-{n}",
            channel=kind["channel"],
            recipient=kind["recipient"],
            priority=priority,
        )
        if kind["status"] != "PENDING":
            store.force(made.id, status=kind["status"])
        rows.append(stored(store, made))

    def matching(**wanted):
        return newest_first(r for r in rows if all(getattr(r, k) == v for k, v in wanted.items()))

    for wanted in [
        {"status": "PENDING"},
        {"status": "SENT"},
        {"status": "FAILED"},
        {"status": "PROCESSING"},
        {"channel": "email"},
        {"recipient": "a@example.com"},
        {"priority": Priority.HIGH},
        {"status": "SENT", "channel": "sms"},
        {"status": "PENDING", "recipient": "a@example.com", "priority": Priority.HIGH},
        {"channel": "email", "priority": Priority.NORMAL},
    ]:
        assert page_of(store, client, **wanted).records == matching(**wanted), wanted
    emails = matching(channel="email")
    assert page_of(store, client, channel="email", limit=2) == ListPage(emails[:2], True)
    assert page_of(store, client, channel="email", after=position(emails[1])).records == emails[2:]


# Cancelling


def test_cancel_pending_cancels_the_clients_pending_row_at_the_callers_time(store):
    client = store.new_client()
    made = store.repository.insert(new=new(client))
    now = T0 + CALLER_SKEW

    cancelled = store.repository.cancel_pending(notification_id=made.id, client_id=client, now=now)

    assert cancelled == dataclasses.replace(made, status="CANCELLED", updated_at=now)
    assert type(cancelled.status) is str
    assert stored(store, made) == cancelled


@pytest.mark.parametrize("status", NOT_PENDING)
def test_cancel_pending_changes_nothing_of_a_row_in_another_status(store, status):
    client = store.new_client()
    made = store.repository.insert(new=new(client))
    store.force(made.id, status=status)
    before = stored(store, made)

    assert (
        store.repository.cancel_pending(notification_id=made.id, client_id=client, now=T0) is None
    )
    assert stored(store, made) == before


def test_cancel_pending_changes_nothing_for_another_client_or_an_unknown_id(store):
    owner = store.new_client()
    made = store.repository.insert(new=new(owner))
    cancel = store.repository.cancel_pending

    assert cancel(notification_id=made.id, client_id=store.new_client(), now=T0) is None
    assert cancel(notification_id=uuid.uuid4(), client_id=owner, now=T0) is None
    assert stored(store, made) == made


def test_a_second_cancel_changes_nothing(store):
    client = store.new_client()
    made = store.repository.insert(new=new(client))
    first = store.repository.cancel_pending(notification_id=made.id, client_id=client, now=T0)
    later = T0 + timedelta(seconds=1)

    assert (
        store.repository.cancel_pending(notification_id=made.id, client_id=client, now=later)
        is None
    )
    assert stored(store, made) == first


# Counting the backlog


def test_pending_count_counts_the_clients_pending_rows_up_to_the_limit(store):
    client, other = store.new_client(), store.new_client()
    for n in range(5):
        store.repository.insert(new=new(client, f"p-{n}"))
    for n, status in enumerate(NOT_PENDING):
        store.force(store.repository.insert(new=new(client, f"x-{n}")).id, status=status)
    for n in range(2):
        store.repository.insert(new=new(other, f"o-{n}"))
    count = store.repository.pending_count

    counted = {limit: count(client_id=client, limit=limit) for limit in (0, 1, 3, 5, 6, 1000)}
    assert counted == {0: 0, 1: 1, 3: 3, 5: 5, 6: 5, 1000: 5}
    assert type(count(client_id=client, limit=10)) is int
    assert count(client_id=other, limit=10) == 2
    assert count(client_id=store.new_client(), limit=10) == 0


# Operator retries


def failed(store, client, key, *, status="FAILED", at=T0, channel="push"):
    """A row the worker left in `status` with every attempt used and its last error kept."""
    made = insert_at(store, at, client, key, channel=channel)
    store.force(made.id, status=status, attempt_count=6, last_error="provider said 503")
    return stored(store, made)


@pytest.mark.parametrize("status", ["FAILED", "DEAD_LETTERED"])
def test_retry_one_sends_the_row_back_due_by_the_database_clock(store, status):
    client = store.new_client()
    row = failed(store, client, "k-1", status=status)
    store.clock_at(T0 + timedelta(hours=1))
    now = T0 + timedelta(hours=1) + CALLER_SKEW

    retried = store.repository.retry_one(notification_id=row.id, operator="admin:ops", now=now)

    assert retried == dataclasses.replace(
        row,
        status="PENDING",
        due_at=T0 + timedelta(hours=1),
        attempt_count=0,
        operator_retries=1,
        last_retried_at=now,
        last_retried_by="admin:ops",
        updated_at=now,
    )
    assert type(retried.status) is str
    assert stored(store, row) == retried

    store.force(row.id, status=status, attempt_count=6)
    again = store.repository.retry_one(notification_id=row.id, operator="api:x", now=now)
    assert (again.operator_retries, again.last_retried_by) == (2, "api:x")


@pytest.mark.parametrize("status", NOT_RETRYABLE)
def test_retry_one_changes_nothing_of_a_row_in_another_status(store, status):
    row = failed(store, store.new_client(), "k-1", status=status)
    retry = store.repository.retry_one

    assert retry(notification_id=row.id, operator="admin:ops", now=T0) is None
    assert retry(notification_id=uuid.uuid4(), operator="admin:ops", now=T0) is None
    assert stored(store, row) == row


def test_retry_oldest_retries_the_oldest_rows_of_one_status(store):
    client = store.new_client()
    dead = [
        failed(store, client, f"d-{n}", status="DEAD_LETTERED", at=T0 + timedelta(seconds=s))
        for n, s in enumerate([0, 1, 1, 1, 2])
    ]
    others = [
        failed(store, client, "f-0", status="FAILED", at=T0 - timedelta(seconds=9)),
        failed(store, client, "s-0", status="SENT", at=T0 - timedelta(seconds=9)),
    ]
    store.clock_at(T0 + timedelta(minutes=10))
    now = T0 + timedelta(minutes=10) + CALLER_SKEW
    chosen = oldest_first(dead)[:3]

    retried = store.repository.retry_oldest(
        status="DEAD_LETTERED", channel=None, limit=3, operator="cli:ops", now=now
    )

    assert all(type(row) is RetriedRow for row in retried)
    # In no particular order: the real statement's RETURNING promises none.
    assert sorted(retried, key=lambda row: row.id) == sorted(
        (RetriedRow(r.id, r.client_id, r.channel, 1) for r in chosen), key=lambda row: row.id
    )
    for row in chosen:
        after = stored(store, row)
        assert (after.status, after.due_at, after.last_retried_at) == (
            "PENDING",
            T0 + timedelta(minutes=10),
            now,
        )
    for row in oldest_first(dead)[3:] + others:
        assert stored(store, row) == row
    count = store.repository.retryable_count
    assert count(status="DEAD_LETTERED", channel=None) == 2
    assert type(count(status="DEAD_LETTERED", channel=None)) is int
    assert count(status="FAILED", channel=None) == 1


def test_retry_oldest_on_one_channel_leaves_the_others(store):
    client = store.new_client()
    emails = [failed(store, client, f"e-{n}", channel="email") for n in range(2)]
    sms = failed(store, client, "s-0", channel="sms", at=T0 - timedelta(seconds=1))

    assert store.repository.retryable_count(status="FAILED", channel="email") == 2
    retried = store.repository.retry_oldest(
        status="FAILED", channel="email", limit=10, operator="x", now=T0
    )

    assert {row.id for row in retried} == {row.id for row in emails}
    assert stored(store, sms) == sms
    assert store.repository.retryable_count(status="FAILED", channel="email") == 0
    assert store.repository.retryable_count(status="FAILED", channel="sms") == 1


def test_retry_oldest_leaves_rows_retried_at_or_after_retried_before(store):
    client = store.new_client()
    never = failed(store, client, "never", at=T0)
    earlier = failed(store, client, "earlier", at=T0 + timedelta(seconds=1))
    since = failed(store, client, "since", at=T0 + timedelta(seconds=2))
    cutoff = T0 + timedelta(minutes=5)
    for row, when in ((earlier, cutoff - timedelta(microseconds=1)), (since, cutoff)):
        store.repository.retry_one(notification_id=row.id, operator="x", now=when)
        store.force(row.id, status="FAILED", attempt_count=6)
    count = store.repository.retryable_count

    assert count(status="FAILED", channel=None, retried_before=cutoff) == 2
    assert count(status="FAILED", channel=None) == 3
    retried = store.repository.retry_oldest(
        status="FAILED", channel=None, limit=10, operator="x", now=cutoff, retried_before=cutoff
    )

    assert {(row.id, row.operator_retries) for row in retried} == {(never.id, 1), (earlier.id, 2)}
    assert stored(store, since).status == "FAILED"


# A SENT row is never taken: the real statement reads the queue table, which holds none.
@pytest.mark.parametrize(("status", "limit"), [("SENT", 10), ("DEAD_LETTERED", 0)])
def test_retry_oldest_takes_no_sent_row_and_none_at_a_limit_of_0(store, status, limit):
    client = store.new_client()
    sent = failed(store, client, "sent", status="SENT")
    dead = failed(store, client, "dead", status="DEAD_LETTERED")

    assert (
        store.repository.retry_oldest(
            status=status, channel=None, limit=limit, operator="x", now=T0
        )
        == []
    )
    assert (stored(store, sent), stored(store, dead)) == (sent, dead)
    assert store.repository.retryable_count(status="SENT", channel=None) == 0
