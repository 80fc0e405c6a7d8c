"""An in-memory stand-in for `NotificationRepository`, for service tests without a database.

It keeps the same promises the real one makes: one row per (client, idempotency key), a
`DuplicateRequest` for the second insert, a cancel that only changes a PENDING row, a retry
that only changes a FAILED or DEAD_LETTERED row.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from notifications.models import Status
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


class InMemoryNotificationRepository:
    def __init__(self) -> None:
        self.rows: dict[uuid.UUID, NotificationRecord] = {}
        self.inserts = 0
        self.pending_counts = 0
        # The database clock: what `notifyqueue_now()` would answer. Tests move it.
        self.now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)

    def insert(self, *, new: NewNotification) -> NotificationRecord:
        existing = self._by_key(new.client_id, new.idempotency_key)
        if existing is not None:
            raise DuplicateRequest(existing)
        now = self.now
        if new.delay_seconds is not None:
            due = now + timedelta(seconds=new.delay_seconds)
        else:
            due = max(new.send_at or now, now)
        values = dataclasses.asdict(new)
        del values["delay_seconds"]
        values.update(send_at=due, due_at=due)
        record = NotificationRecord(
            **values,
            id=uuid.uuid4(),
            status=Status.PENDING,
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

    def insert_many(
        self, *, client_id: uuid.UUID, new: Sequence[NewNotification]
    ) -> list[Inserted]:
        assert len({item.idempotency_key for item in new}) == len(new), "keys must be distinct"
        results = []
        for item in new:
            assert item.client_id == client_id
            try:
                results.append(Inserted(record=self.insert(new=item), created=True))
            except DuplicateRequest as duplicate:
                results.append(Inserted(record=duplicate.existing, created=False))
        return results

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
        cancelled = dataclasses.replace(record, status=Status.CANCELLED, updated_at=now)
        self.rows[record.id] = cancelled
        return cancelled

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
        if record is None or record.status not in (Status.FAILED, Status.DEAD_LETTERED):
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

    @staticmethod
    def _retried(record: NotificationRecord, *, operator: str, now: datetime) -> NotificationRecord:
        return dataclasses.replace(
            record,
            status=Status.PENDING,
            due_at=now,
            attempt_count=0,
            operator_retries=record.operator_retries + 1,
            last_retried_at=now,
            last_retried_by=operator,
            updated_at=now,
        )
