"""The only code that reads or writes notification rows for the API.

Invariants protected here:
- a create is decided by the (client_id, idempotency_key) unique constraint, never by a prior
  read, so two concurrent identical requests produce one row (`DuplicateRequest` for the loser);
  a create, or a whole batch of them, is one statement that also returns the row already
  holding a key, and its send and due times come from the database clock (`notifyqueue_now()`);
- a cancel is one conditional UPDATE guarded by `status = 'PENDING'`, so it cannot overwrite a
  worker's claim, and a worker cannot claim a row a cancel has already taken;
- an operator retry is one conditional UPDATE guarded by the retryable statuses (FAILED,
  DEAD_LETTERED); a bulk retry selects its rows with FOR UPDATE SKIP LOCKED, so two operators
  retrying at once never send the same row back twice;
- a cancel by key is batches of one statement each (`notifications_cancel_by_key`, SKIP
  LOCKED), each its own transaction, repeated until no candidate is left: it never waits for a
  worker, and a worker waits for it at most one batch;
- a client-scoped read never returns another client's row.

Everything returned is a dataclass or a list of them, never a QuerySet. Named SQL runs
through the SQL gateway (`notifyqueue/sqlgateway.py`, rows into dataclasses by column name),
except the thin create path's statements (`_send_checked`, `_send_checked_many`,
`_fetch_created_in_order`), which read rows by position on a psycopg cursor for speed
(docs/technical-design.md, "Running named SQL: the gateway"). The single creates of a process's
threads that arrive together share one statement (`CREATE_COMBINER`, notifications/combiner.py).
"""

from __future__ import annotations

import json
import operator
import os
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from django.db import IntegrityError, connection
from django.db.models import BooleanField
from django.db.models.expressions import RawSQL

from notifications.combiner import CreateCombiner
from notifications.models import (
    QUEUED_STATUSES,
    HeldReason,
    Notification,
    Priority,
    Status,
    held_reason_of,
    recipient_is,
)
from notifyqueue.errors import InvalidRequest
from notifyqueue.sqlgateway import Queries

SQL_FILE = Path(__file__).resolve().parent / "sql" / "notifications.sql"
JSON_COLUMNS = ("metadata", "payload", "fallback_channels")
# A create statement finds neither a new row nor the key's holder only when the holder committed
# while it waited (or was pruned since); the next statement's fresh snapshot settles it.
CREATE_ATTEMPTS = 3


QUERIES = Queries(SQL_FILE)


# The create path's values (a record, a new row, a request) are plain dataclasses with slots,
# not frozen ones: a frozen dataclass writes each field through object.__setattr__, 6.2 µs for
# a record against 1.3 µs, and a batch makes three of them an item. Nothing assigns to one
# after it is made.


@dataclass(slots=True)
class NotificationRecord:
    id: uuid.UUID
    client_id: uuid.UUID
    idempotency_key: str
    request_fingerprint: str
    status: str
    channel: str
    recipient: str
    subject: str
    body: str
    priority: Priority
    metadata: dict[str, Any]
    user_id: str | None
    template: str | None
    payload: dict[str, Any] | None
    fallback_channels: list[str]
    send_at: datetime
    due_at: datetime
    attempt_count: int
    max_attempts: int
    last_error: str | None
    sent_at: datetime | None
    operator_retries: int
    created_at: datetime
    updated_at: datetime
    last_retried_at: datetime | None = None
    last_retried_by: str | None = None
    # When it ends EXPIRED if not sent by then, and the client's key for cancelling a group.
    expires_at: datetime | None = None
    cancellation_key: str | None = None
    # What holds a PENDING row back (`held_reason`): read by the API's reads of a row, not by
    # the creates (a row just created is held by nothing).
    rate_deferred_from: datetime | None = None
    circuit_held_since: datetime | None = None
    quiet_held_since: datetime | None = None
    # The provider's latest delivery receipt (read, like the holds, only by the API's reads).
    receipt: str | None = None
    # The digest bucket that collected the row and its close time; a DIGESTED row's digest.
    digest_bucket_id: uuid.UUID | None = None
    digest_closes_at: datetime | None = None
    digest_id: uuid.UUID | None = None

    def __post_init__(self) -> None:
        # The column is a smallint; the record carries the Priority it stands for.
        if type(self.priority) is not Priority:
            self.priority = Priority(self.priority)

    @property
    def held_reason(self) -> str | None:
        """Why a PENDING row waits past its own time (`held_reason_of`); None if it does not."""
        return held_reason_of(
            status=self.status,
            rate_deferred_from=self.rate_deferred_from,
            circuit_held_since=self.circuit_held_since,
            quiet_held_since=self.quiet_held_since,
            digest_bucket_id=self.digest_bucket_id,
        )

    @property
    def held_until(self) -> datetime | None:
        """When a held row is next due (the rate-limit slot, the circuit's probe time, the
        end of the user's quiet hours, or its digest bucket's close)."""
        reason = self.held_reason
        if reason == HeldReason.DIGEST:
            return self.digest_closes_at
        return self.due_at if reason is not None else None


# The columns only the API's reads of a row select: what holds it back (`held_reason`) and
# its latest delivery receipt.
HOLD_FIELDS = (
    "rate_deferred_from",
    "circuit_held_since",
    "quiet_held_since",
    "receipt",
    "digest_bucket_id",
    "digest_closes_at",
    "digest_id",
)
# The record's columns as the create statements answer them, in order.
RECORD_FIELDS = tuple(f.name for f in fields(NotificationRecord) if f.name not in HOLD_FIELDS)


@dataclass(slots=True, kw_only=True)
class _CreatedRow(NotificationRecord):
    """notification_create's row: the notification, and whether the statement inserted it."""

    created: bool

    def inserted(self) -> Inserted:
        record = NotificationRecord(**{name: getattr(self, name) for name in RECORD_FIELDS})
        return Inserted(record=record, created=self.created)


@dataclass(slots=True)
class NewNotification:
    """What a create writes; the row's id, timestamps and due time are set on insert, by the
    database: `send_at` as the client asked (None or a past time: now), or `delay_seconds`
    from now."""

    client_id: uuid.UUID
    idempotency_key: str
    request_fingerprint: str
    channel: str
    recipient: str
    subject: str
    body: str
    priority: Priority
    metadata: dict[str, Any]
    user_id: str | None
    template: str | None
    payload: dict[str, Any] | None
    fallback_channels: list[str]
    max_attempts: int
    send_at: datetime | None = None
    delay_seconds: int | None = None
    # The expiry: a time, or seconds from the send time (the database computes it).
    expires_at: datetime | None = None
    ttl_seconds: int | None = None
    cancellation_key: str | None = None
    # A digest create (`NotificationRepository.insert_digest`): its key and window.
    digest_key: str | None = None
    digest_window_seconds: int | None = None
    digest_at: str | None = None


@dataclass(frozen=True)
class Inserted:
    """One item of a batch insert: the new row, or (`created` False) the row holding its key."""

    record: NotificationRecord
    created: bool


@dataclass(frozen=True)
class _DigestCreated:
    created: bool
    notification_id: uuid.UUID


@dataclass(frozen=True)
class ListFilters:
    status: str | None = None
    channel: str | None = None
    recipient: str | None = None
    priority: Priority | None = None


@dataclass(frozen=True)
class ListPosition:
    """A row's place in the list order (created_at desc, id desc)."""

    created_at: datetime
    id: uuid.UUID


@dataclass(frozen=True)
class ListPage:
    records: list[NotificationRecord]
    # True when more rows lie beyond this page in the direction it was read.
    has_more: bool


@dataclass(frozen=True)
class RetriedRow:
    """One row a bulk retry sent back to PENDING."""

    id: uuid.UUID
    client_id: uuid.UUID
    channel: str
    operator_retries: int


@dataclass(frozen=True)
class _CancelStep:
    """One batch of a cancel by key: rows cancelled, and whether candidates were left."""

    cancelled: int
    remaining: bool


class CancelNotFinished(Exception):
    """A cancel by key found rows another transaction kept locked past its deadline."""

    def __init__(self, cancelled: int) -> None:
        super().__init__(f"{cancelled} cancelled; rows still locked by another transaction")
        self.cancelled = cancelled


# A cancel by key's rows are cancelled this many a statement (each its own transaction).
CANCEL_BATCH = 1000
# While a worker's statement holds the last candidates, the cancel looks again this often, for
# at most this long (a worker's statements last milliseconds; a transaction an operator keeps
# open does not end on its own).
CANCEL_LOCKED_RETRY_S = 0.01
CANCEL_LOCKED_MAX_S = 30.0


@dataclass(frozen=True)
class KeyCheck:
    """An API key for the create statement to check itself (`notification_create_checked`):
    the unrevoked, unexpired key with this prefix and hash, of the notification's client."""

    prefix: str
    hashed_key: str


class KeyCheckFailed(Exception):
    """The create statement with a `KeyCheck` inserted nothing: the API key is no longer
    usable, or the idempotency key is already used. Nothing was written or read; the caller
    authenticates and creates the long way (which answers a replay)."""


class DuplicateRequest(Exception):
    """The client already used this idempotency key; `existing` is the row that holds it."""

    def __init__(self, existing: NotificationRecord) -> None:
        super().__init__(f"idempotency key {existing.idempotency_key!r} is taken")
        self.existing = existing


def _json_param(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


def _create(params: dict[str, Any]) -> list[Inserted]:
    """notification_create's rows: the new row, or the row already holding its key."""
    try:
        rows = QUERIES.rows("notification_create", row=_CreatedRow, **params)
    except IntegrityError as exc:
        # Only a check constraint can fail here: the key conflict is absorbed by ON CONFLICT.
        raise InvalidRequest(f"The notification breaks a table rule: {exc}") from exc
    return [row.inserted() for row in rows]


_JSON_POSITIONS = tuple(RECORD_FIELDS.index(column) for column in JSON_COLUMNS)
_PRIORITY_POSITION = RECORD_FIELDS.index("priority")
# What the database chose or rewrote for a row it inserted, in this order: a single create
# answers these columns; a batch's rows carry them among the record's columns (`_chosen`).
_CHOSEN_COLUMNS = (
    "id", "metadata", "payload", "fallback_channels", "send_at", "due_at", "created_at",
    "updated_at", "expires_at",
)  # fmt: skip
_chosen = operator.itemgetter(*(1 + RECORD_FIELDS.index(column) for column in _CHOSEN_COLUMNS))
# In a row of `created` and the record's columns.
_KEY_POSITION = 1 + RECORD_FIELDS.index("idempotency_key")


def _record_from_tuple(row: Sequence[Any]) -> NotificationRecord:
    """A NotificationRecord from its columns in order (the thin create statements' answers).

    Not the gateway's build by name: the thin create path reads by position for speed
    (10 µs a binary row against 18 µs)."""
    values = list(row)
    for position in _JSON_POSITIONS:
        if isinstance(values[position], str):
            values[position] = json.loads(values[position])
    values[_PRIORITY_POSITION] = Priority(values[_PRIORITY_POSITION])
    return NotificationRecord(*values)


# This thread's cursor for the checked create, on its server connection: a new cursor sets up
# its row loaders again for every create (~10 µs of the API's CPU). One a thread (as Django's
# connections are), made again when Django has connected again.
_checked = threading.local()


def _checked_cursor() -> psycopg.Cursor:
    connection.ensure_connection()
    cursor = getattr(_checked, "cursor", None)
    if cursor is None or cursor.connection is not connection.connection:
        cursor = _checked.cursor = psycopg.Cursor(connection.connection)
    return cursor


def _send_checked(params: dict[str, Any]) -> Sequence[Any] | None:
    """`notification_create_checked` on this thread's connection: `_CHOSEN_COLUMNS` of the new
    row, or None when nothing was inserted.

    Not through the SQL gateway: a psycopg cursor costs 66 µs a statement against 110 µs
    through Django's cursor wrapper.

    Sent on a psycopg cursor of Django's connection (same connection, same transaction, same
    type adapters; the thread's, kept) rather than through Django's cursor wrapper,
    django-prometheus' statement counters and the per-request health check (`SELECT 1`), and
    read by position: a third of a create's CPU in Python went there. Parameters are bound by
    the server, never in a named prepared statement (PgBouncer's transaction mode)."""
    cursor = _checked_cursor()
    try:
        cursor.execute(QUERIES["notification_create_checked"], params, prepare=False, binary=True)
        return cursor.fetchone()
    except psycopg.IntegrityError as exc:
        raise InvalidRequest(f"The notification breaks a table rule: {exc}") from exc


def _send_checked_many(items: list[dict[str, Any]]) -> list[Sequence[Any] | None]:
    """`notifications_create_checked_many` on this thread's connection for `items` (no two with
    the same client and key): each item's `_CHOSEN_COLUMNS`, or None where nothing was
    inserted, in the items' order."""
    rows: dict[tuple[uuid.UUID, str], Sequence[Any]] = {}
    document = json.dumps([{**item, "client_id": str(item["client_id"])} for item in items])
    cursor = _checked_cursor()
    cursor.execute(
        QUERIES["notifications_create_checked_many"],
        {"items": document},
        prepare=False,
        binary=True,
    )
    for row in cursor:
        rows[(row[0], row[1])] = row[2:]
    return [rows.get((item["client_id"], item["idempotency_key"])) for item in items]


# Sends the single checked creates of this process's threads, gathering those that arrive
# together into one statement (notifications/combiner.py). A forked process has no thread
# that was sending: its child starts with nobody sending.
CREATE_COMBINER = CreateCombiner(send_one=_send_checked, send_many=_send_checked_many)
os.register_at_fork(after_in_child=CREATE_COMBINER.reset)


def _insert_checked(params: dict[str, Any], new: NewNotification) -> NotificationRecord | None:
    """The new row of the checked create (`_record_created`), or None when nothing was inserted.
    Sent through the process's `CREATE_COMBINER`; alone, on this thread's connection, inside a
    transaction (`atomic`), whose row belongs to that transaction."""
    send = _send_checked if connection.in_atomic_block else CREATE_COMBINER.send
    chosen = send(params)
    return None if chosen is None else _record_created(new.client_id, new, chosen)


def _fetch_created_in_order(
    sql: str, params: dict[str, Any], client_id: uuid.UUID, new: dict[str, NewNotification]
) -> list[Inserted]:
    """Rows of a create statement that answers `created` then NotificationRecord's columns in
    order: read by position, in PostgreSQL's binary format (timestamps and JSON decoded in C,
    about half the cost per row of the text format), on a psycopg cursor of Django's
    connection (see `_insert_checked`). A row the statement inserted for `client_id` answers
    only what the database chose (`_record_created`); `new` holds what was sent, by key.

    Not through the SQL gateway: binary rows read by position cost 10 µs a row against 18 µs."""
    connection.ensure_connection()
    try:
        with psycopg.Cursor(connection.connection) as cursor:
            cursor.execute(sql, params, prepare=False, binary=True)
            return [
                Inserted(
                    record=_record_created(client_id, new[row[_KEY_POSITION]], _chosen(row)),
                    created=True,
                )
                if row[0]
                else Inserted(record=_record_from_tuple(row[1:]), created=False)
                for row in cursor
            ]
    except psycopg.IntegrityError as exc:
        # Only a check constraint can fail here: the key conflict is absorbed by ON CONFLICT.
        raise InvalidRequest(f"The notification breaks a table rule: {exc}") from exc


def _record_created(
    client_id: uuid.UUID, new: NewNotification, chosen: Sequence[Any]
) -> NotificationRecord:
    """The record of a row just inserted for `client_id` from `new`: its id, times and JSON
    values from `chosen` (`_CHOSEN_COLUMNS`' values; an empty metadata object or fallback list
    NULL), everything else as the insert wrote it."""
    (
        row_id, metadata, payload, fallback_channels, send_at, due_at, created_at, updated_at,
        expires_at,
    ) = chosen  # fmt: skip
    return NotificationRecord(
        id=row_id,
        client_id=client_id,
        idempotency_key=new.idempotency_key,
        request_fingerprint=new.request_fingerprint,
        status=Status.PENDING.value,
        channel=new.channel,
        recipient=new.recipient,
        subject=new.subject,
        body=new.body,
        priority=new.priority,
        metadata=metadata or {},
        user_id=new.user_id,
        template=new.template,
        payload=payload,
        fallback_channels=fallback_channels or [],
        send_at=send_at,
        due_at=due_at,
        attempt_count=0,
        max_attempts=new.max_attempts,
        last_error=None,
        sent_at=None,
        operator_retries=0,
        created_at=created_at,
        updated_at=updated_at,
        expires_at=expires_at,
        cancellation_key=new.cancellation_key,
    )


def _new_params(new: NewNotification) -> dict[str, Any]:
    """The per-row values of a create, as the SQL files name them."""
    return {
        "request_fingerprint": new.request_fingerprint,
        "idempotency_key": new.idempotency_key,
        "channel": new.channel,
        "recipient": new.recipient,
        "subject": new.subject,
        "body": new.body,
        "priority": int(new.priority),
        "metadata": new.metadata,
        "user_id": new.user_id,
        "template": new.template,
        "payload": new.payload,
        "fallback_channels": new.fallback_channels,
        "send_at": None if new.send_at is None else new.send_at.isoformat(),
        "delay_seconds": new.delay_seconds,
        "max_attempts": new.max_attempts,
        "expires_at": None if new.expires_at is None else new.expires_at.isoformat(),
        "ttl_seconds": new.ttl_seconds,
        "cancellation_key": new.cancellation_key,
    }


def create_params(new: NewNotification, key_check: KeyCheck | None = None) -> dict[str, Any]:
    """A single create's parameters (`notification_create`; with `key_check`,
    `notification_create_checked`), its JSON values encoded."""
    params = _new_params(new)
    params.update(
        client_id=new.client_id,
        **{column: _json_param(params[column]) for column in JSON_COLUMNS},
    )
    if key_check is not None:
        params.update(key_prefix=key_check.prefix, hashed_key=key_check.hashed_key)
    return params


def batch_params(client_id: uuid.UUID, new: Sequence[NewNotification]) -> dict[str, Any]:
    """The parameters of `notifications_create_many` for `new`, the client's."""
    items = [_new_params(item) for item in new]
    return {"client_id": client_id, "items": json.dumps(items, default=str)}


class NotificationRepository:
    """PostgreSQL-backed notification storage for the API."""

    def insert(
        self, *, new: NewNotification, key_check: KeyCheck | None = None
    ) -> NotificationRecord:
        """Inserts the row, or raises `DuplicateRequest` with the row already holding its key.

        With `key_check`, one statement also checks that API key, and inserts or raises
        `KeyCheckFailed` (the key is no longer usable, or already used: nothing was written,
        nothing read)."""
        params = create_params(new, key_check)
        if key_check is not None:
            try:
                record = _insert_checked(params, new)
            except psycopg.OperationalError:
                # A persistent connection the server closed since the last request (what
                # Django's per-request health check finds, which this statement skips). Once
                # more, on a new connection; had the first committed before the loss, the
                # second inserts nothing and the create is answered as a replay.
                if connection.in_atomic_block:
                    raise
                connection.close()
                record = _insert_checked(params, new)
            if record is None:
                raise KeyCheckFailed()
            return record
        for _ in range(CREATE_ATTEMPTS):
            rows = _create(params)
            if rows:
                (found,) = rows
                if found.created:
                    return found.record
                raise DuplicateRequest(found.record)
        raise RuntimeError(f"idempotency key {new.idempotency_key!r}: neither inserted nor found")

    def insert_many(
        self, *, client_id: uuid.UUID, new: Sequence[NewNotification]
    ) -> list[Inserted]:
        """Inserts every row in one statement; for a key the client already used, answers the
        row holding it. Keys must be distinct; the answer is in the order of `new`.

        Not through the SQL gateway: the batch create reads binary rows by position for speed
        (`_fetch_created_in_order`)."""
        sent = {item.idempotency_key: item for item in new}
        if len(sent) != len(new):
            raise ValueError("insert_many needs distinct idempotency keys")
        by_key: dict[str, Inserted] = {}
        missing = list(new)
        for _ in range(CREATE_ATTEMPTS if missing else 0):
            statement = QUERIES["notifications_create_many"]
            params = batch_params(client_id, missing)
            for found in _fetch_created_in_order(statement, params, client_id, sent):
                by_key[found.record.idempotency_key] = found
            missing = [item for item in missing if item.idempotency_key not in by_key]
            if not missing:
                break
        if missing:
            raise RuntimeError(f"{len(missing)} idempotency keys neither inserted nor found")
        return [by_key[key] for key in sent]

    def insert_digest(self, *, new: NewNotification) -> Inserted:
        """A create with a digest key (`notification_digest_create`): the first of its window
        inserted due now (opening the window's bucket), a later one collected into the open
        bucket; or, for a key the client already used, the row holding it (`created` False).
        One statement, its own transaction unless the caller's is open."""
        params = create_params(new)
        params.update(
            digest_key=new.digest_key,
            digest_window_seconds=new.digest_window_seconds,
            digest_at=new.digest_at,
        )
        for _ in range(CREATE_ATTEMPTS):
            try:
                answer = QUERIES.row("notification_digest_create", row=_DigestCreated, **params)
            except IntegrityError as exc:
                raise InvalidRequest(f"The notification breaks a table rule: {exc}") from exc
            if answer is None:
                continue
            record = self.get(notification_id=answer.notification_id, client_id=new.client_id)
            if record is not None:
                return Inserted(record=record, created=answer.created)
        raise RuntimeError(f"idempotency key {new.idempotency_key!r}: neither inserted nor found")

    def get(
        self, *, notification_id: uuid.UUID, client_id: uuid.UUID | None
    ) -> NotificationRecord | None:
        """The row with this id; with `client_id`, only if that client owns it."""
        return QUERIES.row(
            "notification_by_id", row=NotificationRecord, id=notification_id, client_id=client_id
        )

    def get_by_idempotency_key(
        self, *, client_id: uuid.UUID, idempotency_key: str
    ) -> NotificationRecord | None:
        return QUERIES.row(
            "notification_by_key",
            row=NotificationRecord,
            client_id=client_id,
            idempotency_key=idempotency_key,
        )

    def list_page(
        self,
        *,
        client_id: uuid.UUID | None,
        filters: ListFilters,
        after: ListPosition | None,
        before: ListPosition | None,
        limit: int,
    ) -> ListPage:
        """One page in (created_at desc, id desc) order, read by keyset.

        `after` reads older rows than that position (the next page); `before` reads newer rows
        (the previous page). The page is always returned newest first.
        """
        rows = Notification.objects.all()
        if client_id is not None:
            rows = rows.filter(client_id=client_id)
        # Every status but SENT is read through the narrow queue table's indexes (by client:
        # client_id, status, created_at, id; across clients: status, created_at, id), which
        # order the page themselves; SENT rows, the bulk, are the client's newest rows
        # filtered (notification_client_list).
        queued = filters.status in QUEUED_STATUSES
        if queued:
            rows = rows.filter(queue_entry__status=filters.status)
            if client_id is not None:
                rows = rows.filter(queue_entry__client_id=client_id)
        conditions = {
            # A queued status is the queue row's, the record's own copy (its triggers keep the
            # two equal in every snapshot). Named on both, its selectivity counted twice made
            # the planner expect a few rows a page and hash the client's whole history.
            "status": None if queued else filters.status,
            "channel": filters.channel,
            "priority": None if filters.priority is None else int(filters.priority),
        }
        rows = rows.filter(**{k: v for k, v in conditions.items() if v is not None})
        if filters.recipient is not None:
            rows = rows.filter(recipient_is(filters.recipient))
        table = '"notification_queue"' if queued else '"notification"'
        created_at = "queue_entry__created_at" if queued else "created_at"
        if before is not None:
            rows = rows.filter(_position_filter(_NEWER_THAN.format(table=table), before))
            rows = rows.order_by(created_at, "id")
        else:
            if after is not None:
                rows = rows.filter(_position_filter(_OLDER_THAN.format(table=table), after))
            rows = rows.order_by(f"-{created_at}", "-id")
        found = [
            NotificationRecord(**row)
            for row in rows.values(*RECORD_FIELDS, *HOLD_FIELDS)[: limit + 1]
        ]
        page = found[:limit]
        if before is not None:
            page.reverse()
        return ListPage(records=page, has_more=len(found) > limit)

    def cancel_pending(
        self, *, notification_id: uuid.UUID, client_id: uuid.UUID, now: datetime
    ) -> NotificationRecord | None:
        """CANCELLED if it was this client's PENDING row; None (and nothing changed) otherwise."""
        return QUERIES.row(
            "notification_cancel",
            row=NotificationRecord,
            id=notification_id,
            client_id=client_id,
            now=now,
        )

    def retry_one(
        self, *, notification_id: uuid.UUID, operator: str, now: datetime
    ) -> NotificationRecord | None:
        """PENDING again (due now, 0 attempts used) if it was FAILED or DEAD_LETTERED; None
        (and nothing changed) otherwise."""
        return QUERIES.row(
            "notification_retry",
            row=NotificationRecord,
            id=notification_id,
            operator=operator,
            now=now,
        )

    def retry_oldest(
        self,
        *,
        status: str,
        channel: str | None,
        limit: int,
        operator: str,
        now: datetime,
        retried_before: datetime | None = None,
    ) -> list[RetriedRow]:
        """Sends up to `limit` of the oldest rows in `status` back to PENDING, skipping rows
        another transaction has locked; returns the rows it changed."""
        return QUERIES.rows(
            "notifications_retry_oldest",
            row=RetriedRow,
            status=status,
            channel=channel,
            limit=limit,
            operator=operator,
            now=now,
            retried_before=retried_before,
        )

    def retryable_count(
        self, *, status: str, channel: str | None, retried_before: datetime | None = None
    ) -> int:
        return QUERIES.scalar(
            "notifications_retryable_count",
            status=status,
            channel=channel,
            retried_before=retried_before,
        )

    def pending_count(self, *, client_id: uuid.UUID, limit: int) -> int:
        """The client's PENDING rows, counted up to `limit` and no further."""
        return QUERIES.scalar("client_pending_count", client_id=client_id, limit=limit)

    def database_now(self) -> datetime:
        """The database clock (`notifyqueue_now()`)."""
        return QUERIES.scalar("database_now")

    def cancel_by_key(
        self, *, client_id: uuid.UUID, cancellation_key: str, batch: int = CANCEL_BATCH
    ) -> int:
        """Cancels every row of the client with this key whose send has not started, `batch`
        a statement, each statement its own transaction (outside one: the caller's atomic
        block would hold every lock to the end); returns how many. Returns only once no
        candidate is left; raises CancelNotFinished when some stayed locked by other
        transactions for CANCEL_LOCKED_MAX_S."""
        total = 0
        deadline = time.monotonic() + CANCEL_LOCKED_MAX_S
        while True:
            step = QUERIES.row(
                "notifications_cancel_by_key",
                row=_CancelStep,
                client_id=client_id,
                cancellation_key=cancellation_key,
                limit=batch,
            )
            total += step.cancelled
            if not step.remaining:
                return total
            if step.cancelled == 0:
                if time.monotonic() >= deadline:
                    raise CancelNotFinished(total)
                time.sleep(CANCEL_LOCKED_RETRY_S)


# Row-value comparisons let PostgreSQL walk the (..., created_at desc, id desc) indexes from the
# position onwards, which an OR of two conditions would not.
_OLDER_THAN = '({table}."created_at", {table}."id") < (%s, %s)'
_NEWER_THAN = '({table}."created_at", {table}."id") > (%s, %s)'


def _position_filter(sql: str, position: ListPosition) -> RawSQL:
    return RawSQL(sql, (position.created_at, position.id), output_field=BooleanField())
