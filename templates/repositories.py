"""The only code that reads or writes message templates.

Invariants protected here:
- a PUT is one upsert on the (client, event, channel) unique constraint, so concurrent PUTs
  leave exactly one template, the last one written;
- reads are scoped to a client: one client never sees another's templates.

Everything returned is a frozen dataclass (or a dict of them), never a QuerySet.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable
from dataclasses import dataclass, fields
from datetime import datetime
from pathlib import Path

from notifyqueue.sqlgateway import Queries
from templates.models import MessageTemplate

SQL = Queries(Path(__file__).with_name("sql") / "templates.sql")


@dataclass(frozen=True)
class TemplateRecord:
    client_id: uuid.UUID
    event: str
    channel: str
    subject: str
    body: str
    created_at: datetime
    updated_at: datetime


RECORD_FIELDS = tuple(f.name for f in fields(TemplateRecord))


@dataclass(frozen=True)
class _UpsertedTemplate(TemplateRecord):
    """template_upsert's row: the template, and whether the statement created it."""

    created: bool

    def record(self) -> TemplateRecord:
        return TemplateRecord(**{name: getattr(self, name) for name in RECORD_FIELDS})


class TemplateRepository:
    def upsert(
        self,
        *,
        client_id: uuid.UUID,
        event: str,
        channel: str,
        subject: str,
        body: str,
        now: datetime,
    ) -> tuple[TemplateRecord, bool]:
        """Creates or replaces the template; the flag is True when it was created."""
        upserted = SQL.row(
            "template_upsert",
            row=_UpsertedTemplate,
            client_id=client_id,
            event=event,
            channel=channel,
            subject=subject,
            body=body,
            now=now,
        )
        return upserted.record(), upserted.created

    def get(self, *, client_id: uuid.UUID, event: str, channel: str) -> TemplateRecord | None:
        found = self.get_many(client_id=client_id, event=event, channels=[channel])
        return found.get(channel)

    def get_many(
        self, *, client_id: uuid.UUID, event: str, channels: Iterable[str]
    ) -> dict[str, TemplateRecord]:
        """The client's templates for `event` on any of `channels`, by channel."""
        rows = MessageTemplate.objects.filter(
            client_id=client_id, event=event, channel__in=list(channels)
        ).values(*RECORD_FIELDS)
        return {row["channel"]: TemplateRecord(**row) for row in rows}

    def get_each(
        self, *, keys: Collection[tuple[uuid.UUID, str, str]]
    ) -> dict[tuple[uuid.UUID, str, str], TemplateRecord]:
        """The template of each (client id, event, channel) given that has one, by that key, in
        one statement."""
        if not keys:
            return {}
        client_ids, events, channels = zip(*keys, strict=True)
        rows = SQL.rows(
            "templates_read_many",
            row=TemplateRecord,
            client_ids=list(client_ids),
            events=list(events),
            channels=list(channels),
        )
        return {(row.client_id, row.event, row.channel): row for row in rows}
