"""The only code that reads or writes users' preferences and their in-app inbox.

Invariants protected here:
- a PUT of preferences is one upsert on the (client, user_id) unique constraint: the whole
  document is replaced at once, so a reader never sees half of an update;
- every read and write is scoped to the client (and the user): another client's preferences
  or inbox messages are never returned or changed;
- marking an inbox message read is idempotent and keeps the first read time.

Everything returned is a frozen dataclass (or a list of them), never a QuerySet.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from django.db import connection

from notifyqueue.sqlfile import queries_load
from preferences.models import UserPreferences

SQL = queries_load(Path(__file__).with_name("sql") / "preferences.sql")


@dataclass(frozen=True)
class PreferencesRecord:
    client_id: uuid.UUID
    user_id: str
    channels: tuple[str, ...]
    addresses: dict[str, str]
    muted_events: tuple[str, ...]
    disabled_channels: tuple[str, ...]
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class InboxRecord:
    id: uuid.UUID
    notification_id: uuid.UUID
    subject: str
    body: str
    metadata: dict[str, Any]
    created_at: datetime
    read_at: datetime | None


@dataclass(frozen=True)
class InboxPosition:
    """A message's place in the inbox order (created_at desc, id desc)."""

    created_at: datetime
    id: uuid.UUID


@dataclass(frozen=True)
class InboxPage:
    messages: list[InboxRecord]
    # True when older messages follow this page.
    has_more: bool


def _json(value: Any) -> Any:
    # Django registers a text loader for jsonb, so raw cursors see JSON text.
    return json.loads(value) if isinstance(value, str) else value


def _preferences(values: dict[str, Any]) -> PreferencesRecord:
    return PreferencesRecord(
        client_id=values["client_id"],
        user_id=values["user_id"],
        channels=tuple(_json(values["channels"])),
        addresses=dict(_json(values["addresses"])),
        muted_events=tuple(_json(values["muted_events"])),
        disabled_channels=tuple(_json(values["disabled_channels"])),
        created_at=values["created_at"],
        updated_at=values["updated_at"],
    )


def _inbox(row: tuple) -> InboxRecord:
    id_, notification_id, subject, body, metadata, created_at, read_at = row
    return InboxRecord(id_, notification_id, subject, body, _json(metadata), created_at, read_at)


class PreferencesRepository:
    def upsert(
        self,
        *,
        client_id: uuid.UUID,
        user_id: str,
        channels: list[str],
        addresses: dict[str, str],
        muted_events: list[str],
        disabled_channels: list[str],
        now: datetime,
    ) -> tuple[PreferencesRecord, bool]:
        """Replaces the user's preferences; the flag is True when there were none before."""
        params = {
            "client_id": client_id,
            "user_id": user_id,
            "channels": json.dumps(channels),
            "addresses": json.dumps(addresses),
            "muted_events": json.dumps(muted_events),
            "disabled_channels": json.dumps(disabled_channels),
            "now": now,
        }
        with connection.cursor() as cursor:
            cursor.execute(SQL["preferences_upsert"], params)
            columns = [column.name for column in cursor.description]
            row = dict(zip(columns, cursor.fetchone(), strict=True))
        return _preferences(row), row["created"]

    def get(self, *, client_id: uuid.UUID, user_id: str) -> PreferencesRecord | None:
        row = (
            UserPreferences.objects.filter(client_id=client_id, user_id=user_id)
            .values(
                "client_id",
                "user_id",
                "channels",
                "addresses",
                "muted_events",
                "disabled_channels",
                "created_at",
                "updated_at",
            )
            .first()
        )
        return None if row is None else _preferences(row)


class InboxRepository:
    def page(
        self,
        *,
        client_id: uuid.UUID,
        user_id: str,
        unread_only: bool,
        after: InboxPosition | None,
        limit: int,
    ) -> InboxPage:
        params = {
            "client_id": client_id,
            "user_id": user_id,
            "unread_only": unread_only,
            "after_created_at": after and after.created_at,
            "after_id": after and after.id,
            "limit": limit,
        }
        with connection.cursor() as cursor:
            cursor.execute(SQL["inbox_page"], params)
            rows = [_inbox(row) for row in cursor.fetchall()]
        return InboxPage(messages=rows[:limit], has_more=len(rows) > limit)

    def mark_read(
        self, *, client_id: uuid.UUID, user_id: str, message_id: uuid.UUID, now: datetime
    ) -> InboxRecord | None:
        """The message, now read; None when the client's user has no such message."""
        params = {"client_id": client_id, "user_id": user_id, "id": message_id, "now": now}
        with connection.cursor() as cursor:
            cursor.execute(SQL["inbox_message_read"], params)
            row = cursor.fetchone()
        return None if row is None else _inbox(row)
