"""The only code that reads or writes the suppression list.

Invariants protected here:
- the send-time lookup is one statement per claim, an index probe per row: its cost follows
  the claim, never the list;
- an entry is added at most once per (channel, address, scope); adding it again answers the
  existing one;
- a removal deletes exactly the entry named and answers it (for the log), or None.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from notifyqueue.sqlgateway import Queries

SQL = Queries(Path(__file__).with_name("sql") / "suppressions.sql")


@dataclass(frozen=True)
class SuppressionRecord:
    id: uuid.UUID
    channel: str
    address: str
    # None: every client.
    client_id: uuid.UUID | None
    reason: str
    source: str
    created_at: datetime


@dataclass(frozen=True)
class _Added(SuppressionRecord):
    created: bool = False


@dataclass(frozen=True)
class AddressCheck:
    """One claimed row to look up: its id, client, channel and address's counting form."""

    id: uuid.UUID
    client_id: uuid.UUID
    channel: str
    address: str


@dataclass(frozen=True)
class _Match:
    id: uuid.UUID
    reason: str


@dataclass(frozen=True)
class SuppressionPage:
    entries: list[SuppressionRecord]
    has_more: bool


class SuppressionRepository:
    def matches(self, checks: Sequence[AddressCheck]) -> dict[uuid.UUID, str]:
        """The reason each suppressed row of `checks` is suppressed for, by row id."""
        if not checks:
            return {}
        found = SQL.rows(
            "suppression_matches",
            row=_Match,
            ids=[c.id for c in checks],
            client_ids=[c.client_id for c in checks],
            channels=[c.channel for c in checks],
            addresses=[c.address for c in checks],
        )
        return {m.id: m.reason for m in found}

    def add(
        self,
        *,
        channel: str,
        address: str,
        client_id: uuid.UUID | None,
        reason: str,
        source: str,
    ) -> tuple[SuppressionRecord, bool]:
        """The entry for (channel, address, scope), and True when this call added it."""
        for _ in range(3):
            added = SQL.row(
                "suppression_add",
                row=_Added,
                channel=channel,
                address=address,
                client_id=client_id,
                reason=reason,
                source=source,
            )
            # None only when a concurrent add committed between the insert's check and the
            # read of the existing row: the next round reads it.
            if added is not None:
                record = SuppressionRecord(
                    **{k: v for k, v in added.__dict__.items() if k != "created"}
                )
                return record, added.created
        raise RuntimeError("suppression_add found neither a new nor an existing entry")

    def page(
        self,
        *,
        channel: str | None,
        after_created_at: datetime | None,
        after_id: uuid.UUID | None,
        limit: int,
    ) -> SuppressionPage:
        rows = SQL.rows(
            "suppression_page",
            row=SuppressionRecord,
            channel=channel,
            after_created_at=after_created_at,
            after_id=after_id,
            limit=limit + 1,
        )
        return SuppressionPage(entries=rows[:limit], has_more=len(rows) > limit)

    def remove(self, *, id: uuid.UUID) -> SuppressionRecord | None:
        return SQL.row("suppression_remove", row=SuppressionRecord, id=id)
