"""The only code that reads or writes receipts and the ids of signed provider events.

Invariants protected here:
- a signed event's id is accepted once per channel, and a receipt recorded once per (channel,
  message id, type, bounce), in the transaction the caller opens: a replay or a duplicate
  leaves nothing behind;
- a pending receipt is applied once: the statement that ties it to its notification takes
  it only while it is untied, and skips one another transaction holds;
- a receipt matches only a SENT attempt on its own channel with exactly its message id.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from notifyqueue.sqlgateway import Queries

SQL = Queries(Path(__file__).with_name("sql") / "receipts.sql")


@dataclass(frozen=True)
class MatchedReceipt:
    """A receipt just tied to its notification, with what applying it needs."""

    id: uuid.UUID
    channel: str
    message_id: str
    type: str
    bounce: str | None
    occurred_at: datetime
    received_at: datetime
    notification_id: uuid.UUID
    client_id: uuid.UUID
    recipient: str
    status: str
    attempt_count: int
    # Whether the notification's client has a webhook URL (an event is written for it).
    hooked: bool


@dataclass(frozen=True)
class ReceiptRecord:
    type: str
    bounce: str | None
    message_id: str
    channel: str
    occurred_at: datetime
    received_at: datetime


@dataclass(frozen=True)
class PendingPosition:
    id: uuid.UUID
    received_at: datetime


class ReceiptRepository:
    def event_accept(self, *, channel: str, event_id: str) -> bool:
        """False when this channel accepted an event with this id before (a replay)."""
        return SQL.scalar("provider_event_accept", channel=channel, event_id=event_id) is not None

    def add(
        self,
        *,
        channel: str,
        message_id: str,
        type: str,
        bounce: str | None,
        occurred_at: datetime,
        event_id: str,
    ) -> uuid.UUID | None:
        """The new receipt's id; None when the same receipt was recorded before."""
        return SQL.scalar(
            "receipt_add",
            channel=channel,
            message_id=message_id,
            type=type,
            bounce=bounce,
            occurred_at=occurred_at,
            event_id=event_id,
        )

    def match_messages(self, keys: Sequence[tuple[str, str]]) -> list[MatchedReceipt]:
        """Ties the pending receipts of these (channel, message id) pairs to their SENT
        attempt's notification, where one is recorded."""
        if not keys:
            return []
        return SQL.rows(
            "receipts_match_messages",
            row=MatchedReceipt,
            channels=[channel for channel, _ in keys],
            message_ids=[message_id for _, message_id in keys],
        )

    def match_ids(self, ids: Sequence[uuid.UUID]) -> list[MatchedReceipt]:
        if not ids:
            return []
        return SQL.rows("receipts_match_ids", row=MatchedReceipt, ids=list(ids))

    def pending_page(self, *, after: PendingPosition | None, limit: int) -> list[PendingPosition]:
        return SQL.rows(
            "receipts_pending_page",
            row=PendingPosition,
            after_received_at=after and after.received_at,
            after_id=after and after.id,
            limit=limit,
        )

    def notification_receipts_set(self, latest: dict[uuid.UUID, str]) -> int:
        if not latest:
            return 0
        return SQL.execute(
            "notification_receipt_set", ids=list(latest), types=list(latest.values())
        )

    def notification_visible(
        self, *, notification_id: uuid.UUID, client_id: uuid.UUID | None
    ) -> bool:
        return bool(
            SQL.scalar("notification_visible", notification_id=notification_id, client_id=client_id)
        )

    def of_notification(
        self, *, notification_id: uuid.UUID, client_id: uuid.UUID | None, limit: int
    ) -> list[ReceiptRecord]:
        return SQL.rows(
            "receipts_of_notification",
            row=ReceiptRecord,
            notification_id=notification_id,
            client_id=client_id,
            limit=limit,
        )

    def prune(self, *, pending_age_s: float, seen_age_s: float, limit: int) -> int:
        """Deletes up to `limit` pending receipts and as many event ids past their ages."""
        pending = SQL.execute("receipts_pending_prune", age_s=pending_age_s, limit=limit)
        seen = SQL.execute("provider_events_seen_prune", age_s=seen_age_s, limit=limit)
        return pending + seen
