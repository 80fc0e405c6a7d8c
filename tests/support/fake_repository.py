"""An in-memory stand-in for `NotificationRepository`, for service tests without a database.

It keeps the promises the real one makes, and
tests/integration/test_notification_repository_contract.py runs the same tests against both:
one row per (client, idempotency key), a `DuplicateRequest` for the second insert, an
`InvalidRequest` for a row that breaks a table rule (nothing stored), times from the database
clock (`now` here), a cancel that only changes a PENDING row, a retry that only changes a
FAILED or DEAD_LETTERED row.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from notifications.models import QUEUED_STATUSES, Status
from notifications.repositories import (
    DuplicateRequest,
    Inserted,
    ListFilters,
    ListPage,
    ListPosition,
    NewNotification,
    NotificationRecord,
    RetriedRow,
)
from notifyqueue.errors import InvalidRequest
from notifyqueue.vocabulary import Channel

RETRYABLE = (Status.FAILED.value, Status.DEAD_LETTERED.value)


class InMemoryNotificationRepository:
    def __init__(self) -> None:
        self.rows: dict[uuid.UUID, NotificationRecord] = {}
        self.inserts = 0
        self.pending_counts = 0
        # The database clock: what `notifyqueue_now()` would answer. Tests move it.
        self.now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)

    def insert(self, *, new: NewNotification) -> NotificationRecord:
        _check_table_rules(new)
        existing = self._by_key(new.client_id, new.idempotency_key)
        if existing is not None:
            raise DuplicateRequest(existing)
        return self._store(new)

    def insert_many(
        self, *, client_id: uuid.UUID, new: Sequence[NewNotification]
    ) -> list[Inserted]:
        if len({item.idempotency_key for item in new}) != len(new):
            raise ValueError("insert_many needs distinct idempotency keys")
        # One statement: a row that breaks a rule stores none of the batch.
        for item in new:
            _check_table_rules(item)
        results = []
        for item in new:
            existing = self._by_key(client_id, item.idempotency_key)
            if existing is not None:
                results.append(Inserted(record=existing, created=False))
            else:
                item = dataclasses.replace(item, client_id=client_id)
                results.append(Inserted(record=self._store(item), created=True))
        return results

    def _store(self, new: NewNotification) -> NotificationRecord:
        now = self.now
        if new.delay_seconds is not None:
            due = now + timedelta(seconds=new.delay_seconds)
        else:
            due = max(new.send_at or now, now)
        values = dataclasses.asdict(new)
        del values["delay_seconds"]
        # A digest create's key and window are the bucket's, not the record's.
        for name in ("digest_key", "digest_window_seconds", "digest_at"):
            del values[name]
        ttl_seconds = values.pop("ttl_seconds")
        if ttl_seconds is not None:
            values["expires_at"] = due + timedelta(seconds=ttl_seconds)
        values.update(send_at=due, due_at=due)
        record = NotificationRecord(
            **values,
            id=uuid.uuid4(),
            status=Status.PENDING.value,
            attempt_count=0,
            last_error=None,
            sent_at=None,
            operator_retries=0,
            created_at=now,
            updated_at=now,
        )
        self.rows[record.id] = record
        self.inserts += 1
        return record

    def get(
        self, *, notification_id: uuid.UUID, client_id: uuid.UUID | None
    ) -> NotificationRecord | None:
        record = self.rows.get(notification_id)
        if record is None or (client_id is not None and record.client_id != client_id):
            return None
        return record

    def get_by_idempotency_key(
        self, *, client_id: uuid.UUID, idempotency_key: str
    ) -> NotificationRecord | None:
        return self._by_key(client_id, idempotency_key)

    def _by_key(self, client_id: uuid.UUID, idempotency_key: str) -> NotificationRecord | None:
        # The unique constraint's view of the rows; insert consults it whatever the lookup says.
        for record in self.rows.values():
            if record.client_id == client_id and record.idempotency_key == idempotency_key:
                return record
        return None

    def list_page(
        self,
        *,
        client_id: uuid.UUID | None,
        filters: ListFilters,
        after: ListPosition | None,
        before: ListPosition | None,
        limit: int,
    ) -> ListPage:
        def key(record: NotificationRecord) -> tuple:
            return (record.created_at, record.id)

        wanted = {k: v for k, v in dataclasses.asdict(filters).items() if v is not None}
        rows = [
            r
            for r in self.rows.values()
            if (client_id is None or r.client_id == client_id)
            and all(getattr(r, name) == value for name, value in wanted.items())
        ]
        if before is not None:
            rows = sorted((r for r in rows if key(r) > (before.created_at, before.id)), key=key)
            page = rows[:limit]
            page.reverse()
        else:
            if after is not None:
                rows = [r for r in rows if key(r) < (after.created_at, after.id)]
            rows = sorted(rows, key=key, reverse=True)
            page = rows[:limit]
        return ListPage(records=page, has_more=len(rows) > limit)

    def cancel_pending(
        self, *, notification_id: uuid.UUID, client_id: uuid.UUID, now: datetime
    ) -> NotificationRecord | None:
        record = self.get(notification_id=notification_id, client_id=client_id)
        if record is None or record.status != Status.PENDING:
            return None
        cancelled = dataclasses.replace(record, status=Status.CANCELLED.value, updated_at=now)
        self.rows[record.id] = cancelled
        return cancelled

    def database_now(self) -> datetime:
        return self.now

    def cancel_by_key(self, *, client_id: uuid.UUID, cancellation_key: str, batch: int) -> int:
        """Every PENDING row of the client with the key (nothing here is ever claimed)."""
        chosen = [
            r
            for r in self.rows.values()
            if r.client_id == client_id
            and r.cancellation_key == cancellation_key
            and r.status == Status.PENDING
        ]
        for record in chosen:
            self.rows[record.id] = dataclasses.replace(
                record, status=Status.CANCELLED.value, updated_at=self.now
            )
        return len(chosen)

    def pending_count(self, *, client_id: uuid.UUID, limit: int) -> int:
        self.pending_counts += 1
        pending = sum(
            1 for r in self.rows.values() if r.client_id == client_id and r.status == Status.PENDING
        )
        return min(pending, limit)

    def retry_one(
        self, *, notification_id: uuid.UUID, operator: str, now: datetime
    ) -> NotificationRecord | None:
        record = self.rows.get(notification_id)
        if record is None or record.status not in RETRYABLE:
            return None
        retried = self._retried(record, operator=operator, now=now)
        self.rows[record.id] = retried
        return retried

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
        chosen = sorted(
            self._retryable(status, channel, retried_before), key=lambda r: (r.created_at, r.id)
        )[:limit]
        retried = []
        for record in chosen:
            self.rows[record.id] = self._retried(record, operator=operator, now=now)
            retried.append(
                RetriedRow(record.id, record.client_id, record.channel, record.operator_retries + 1)
            )
        return retried

    def retryable_count(
        self, *, status: str, channel: str | None, retried_before: datetime | None = None
    ) -> int:
        return len(self._retryable(status, channel, retried_before))

    def _retryable(self, status, channel, retried_before) -> list[NotificationRecord]:
        # The real query reads the queue table, which holds every row but the SENT ones.
        if status not in QUEUED_STATUSES:
            return []
        return [
            r
            for r in self.rows.values()
            if r.status == status
            and (channel is None or r.channel == channel)
            and (
                retried_before is None
                or r.last_retried_at is None
                or r.last_retried_at < retried_before
            )
        ]

    def _retried(
        self, record: NotificationRecord, *, operator: str, now: datetime
    ) -> NotificationRecord:
        # Due by the database clock; the operator's `now` stamps who retried when.
        return dataclasses.replace(
            record,
            status=Status.PENDING.value,
            due_at=self.now,
            attempt_count=0,
            operator_retries=record.operator_retries + 1,
            last_retried_at=now,
            last_retried_by=operator,
            updated_at=now,
        )


def _check_table_rules(new: NewNotification) -> None:
    """The rules the table's domains hold for a new row (notifications 0001_initial)."""
    if new.channel not in Channel.values:
        raise InvalidRequest(f"The notification breaks a table rule: channel {new.channel!r}")
    if new.max_attempts < 0:
        raise InvalidRequest("The notification breaks a table rule: max_attempts below 0")
