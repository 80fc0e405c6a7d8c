"""The only code that reads or writes users' preferences and their in-app inbox.

Invariants protected here:
- a PUT of preferences is one upsert on the (client, user_id) unique constraint: the whole
  document is replaced at once, so a reader never sees half of an update;
- every read and write is scoped to the client (and the user): another client's preferences
  or inbox messages are never returned or changed;
- marking an inbox message read is idempotent and keeps the first read time;
- a time zone is known when PostgreSQL's time zone database lists it (pg_timezone_names): the
  database that turns quiet hours' wall-clock times into instants is the one that vouches for
  the name.

Everything returned is a frozen dataclass (or a list of them), never a QuerySet.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Collection
from dataclasses import dataclass, fields
from datetime import datetime
from pathlib import Path
from typing import Any

from notifyqueue.sqlgateway import Queries
from preferences.models import UserPreferences

SQL = Queries(Path(__file__).with_name("sql") / "preferences.sql")


@dataclass(frozen=True)
class QuietWindow:
    """A window of the user's local wall-clock time ("HH:MM"); start later than end crosses
    midnight. `channels` None: every channel."""

    start: str
    end: str
    channels: tuple[str, ...] | None = None

    def document(self) -> dict[str, Any]:
        """The window as stored and shown: "channels" left out when it means every channel."""
        window: dict[str, Any] = {"start": self.start, "end": self.end}
        if self.channels is not None:
            window["channels"] = list(self.channels)
        return window


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
    timezone: str = "UTC"
    quiet_hours: tuple[QuietWindow, ...] = ()


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


@dataclass(frozen=True)
class _PreferencesRow:
    """A user_preferences row as read: its jsonb lists arrive as lists, which the frozen
    record holds as tuples."""

    client_id: uuid.UUID
    user_id: str
    channels: list[str]
    addresses: dict[str, str]
    muted_events: list[str]
    disabled_channels: list[str]
    created_at: datetime
    updated_at: datetime
    timezone: str
    quiet_hours: list[dict[str, Any]]
    # Only preferences_upsert returns it: True when the statement inserted the row.
    created: bool = False

    def record(self) -> PreferencesRecord:
        return PreferencesRecord(
            client_id=self.client_id,
            user_id=self.user_id,
            channels=tuple(self.channels),
            addresses=dict(self.addresses),
            muted_events=tuple(self.muted_events),
            disabled_channels=tuple(self.disabled_channels),
            created_at=self.created_at,
            updated_at=self.updated_at,
            timezone=self.timezone,
            quiet_hours=tuple(
                QuietWindow(
                    start=window["start"],
                    end=window["end"],
                    channels=None if window.get("channels") is None else tuple(window["channels"]),
                )
                for window in self.quiet_hours
            ),
        )


_PREFERENCES_COLUMNS = tuple(f.name for f in fields(PreferencesRecord))


class TimezoneNames:
    """PostgreSQL's time zone names, read once per process (pg_timezone_names takes ~15 ms):
    each name's lower case to its spelling there. A server upgraded to a newer time zone
    database is seen by processes started after it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._names: dict[str, str] | None = None

    def spelling(self, name: str) -> str | None:
        """The zone's name as PostgreSQL spells it; None when PostgreSQL knows no such zone."""
        with self._lock:
            if self._names is None:
                self._names = {zone.lower(): zone for zone in SQL.scalars("timezone_names")}
            return self._names.get(name.lower())


TIMEZONES = TimezoneNames()


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
        timezone: str,
        quiet_hours: list[QuietWindow],
        now: datetime,
    ) -> tuple[PreferencesRecord, bool]:
        """Replaces the user's preferences; the flag is True when there were none before. A
        change of time zone or quiet hours re-times the user's held notifications in the same
        statement (the trigger `user_preferences_quiet_hours_changed`)."""
        upserted = SQL.row(
            "preferences_upsert",
            row=_PreferencesRow,
            client_id=client_id,
            user_id=user_id,
            channels=json.dumps(channels),
            addresses=json.dumps(addresses),
            muted_events=json.dumps(muted_events),
            disabled_channels=json.dumps(disabled_channels),
            timezone=timezone,
            quiet_hours=json.dumps([window.document() for window in quiet_hours]),
            now=now,
        )
        return upserted.record(), upserted.created

    def timezone_spelling(self, name: str) -> str | None:
        return TIMEZONES.spelling(name)

    def event_mute(self, *, client_id: uuid.UUID, user_id: str, event: str, now: datetime) -> bool:
        """Adds `event` to the user's muted events; False when it was muted already or the
        user has no preferences."""
        return (
            SQL.scalar(
                "preferences_event_mute",
                client_id=client_id,
                user_id=user_id,
                event=event,
                now=now,
            )
            is not None
        )

    def get(self, *, client_id: uuid.UUID, user_id: str) -> PreferencesRecord | None:
        values = (
            UserPreferences.objects.filter(client_id=client_id, user_id=user_id)
            .values(*_PREFERENCES_COLUMNS)
            .first()
        )
        return None if values is None else _PreferencesRow(**values).record()

    def get_many(
        self, *, users: Collection[tuple[uuid.UUID, str]]
    ) -> dict[tuple[uuid.UUID, str], PreferencesRecord]:
        """The preferences of each (client id, user id) given that has some, by that pair, in
        one statement."""
        if not users:
            return {}
        client_ids, user_ids = zip(*users, strict=True)
        rows = SQL.rows(
            "preferences_read_many",
            row=_PreferencesRow,
            client_ids=list(client_ids),
            user_ids=list(user_ids),
        )
        return {(row.client_id, row.user_id): row.record() for row in rows}


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
        rows = SQL.rows(
            "inbox_page",
            row=InboxRecord,
            client_id=client_id,
            user_id=user_id,
            unread_only=unread_only,
            after_created_at=after and after.created_at,
            after_id=after and after.id,
            limit=limit,
        )
        return InboxPage(messages=rows[:limit], has_more=len(rows) > limit)

    def mark_read(
        self, *, client_id: uuid.UUID, user_id: str, message_id: uuid.UUID, now: datetime
    ) -> InboxRecord | None:
        """The message, now read; None when the client's user has no such message."""
        return SQL.row(
            "inbox_message_read",
            row=InboxRecord,
            client_id=client_id,
            user_id=user_id,
            id=message_id,
            now=now,
        )
