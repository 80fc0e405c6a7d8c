"""Users' preferences: reading and replacing them. No ORM here.

Which channel carries a notification, at create and again at send, is in
`preferences/routing.py`; the in-app inbox is in `preferences/inbox.py`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime

from notifyqueue.errors import InvalidRequest, NotFound
from notifyqueue.vocabulary import Channel
from preferences.repositories import PreferencesRecord, PreferencesRepository, QuietWindow
from preferences.routing import PreferenceStore


class PreferencesNotFound(NotFound):
    def __init__(self, user_id: str) -> None:
        super().__init__(f"User {user_id!r} has no preferences.")


@dataclass(frozen=True)
class PreferencesInput:
    channels: list[str]
    addresses: dict[str, str]
    muted_events: list[str]
    disabled_channels: list[str]
    # An IANA zone name, checked against PostgreSQL's time zone database by `preferences_put`.
    timezone: str = "UTC"
    quiet_hours: list[QuietWindow] = field(default_factory=list)


@dataclass(frozen=True)
class PreferencesSaved:
    preferences: PreferencesRecord
    created: bool


def preferences_put(
    *,
    client_id: uuid.UUID,
    user_id: str,
    preferences: PreferencesInput,
    now: datetime,
    repository: PreferencesRepository | None = None,
) -> PreferencesSaved:
    """Replaces the user's preferences. In-flight notifications follow them at send time; a
    notification held by quiet hours is re-timed to the new ones at once (sent now if none
    holds it any more). The time zone is stored as PostgreSQL's time zone database spells it;
    one that database does not know is a 400."""
    repository = repository or PreferencesRepository()
    zone = repository.timezone_spelling(preferences.timezone)
    if zone is None:
        message = "Not a time zone PostgreSQL knows: an IANA name such as Europe/Berlin."
        raise InvalidRequest(f"timezone: {message}", fields={"timezone": [message]})
    addresses = dict(preferences.addresses)
    in_app = addresses.pop(Channel.IN_APP, None)
    if in_app is not None and in_app != user_id:
        message = "The in_app address is always the user id; leave it out."
        raise InvalidRequest(f"addresses: {message}", fields={"addresses": [message]})
    record, created = repository.upsert(
        client_id=client_id,
        user_id=user_id,
        channels=preferences.channels,
        addresses=addresses,
        muted_events=preferences.muted_events,
        disabled_channels=preferences.disabled_channels,
        timezone=zone,
        quiet_hours=preferences.quiet_hours,
        now=now,
    )
    return PreferencesSaved(preferences=record, created=created)


def preferences_get(
    *, client_id: uuid.UUID, user_id: str, repository: PreferenceStore | None = None
) -> PreferencesRecord:
    found = (repository or PreferencesRepository()).get(client_id=client_id, user_id=user_id)
    if found is None:
        raise PreferencesNotFound(user_id)
    return found


def preferences_event_mute(
    *, client_id: uuid.UUID, user_id: str, event: str, now: datetime
) -> bool:
    """Mutes `event` for the user (a one-click unsubscribe): what is already queued for it is
    suppressed at its send-time check. Idempotent; False when nothing changed (muted before,
    or the user has no preferences, so nothing can be sent to them in preference mode)."""
    return PreferencesRepository().event_mute(
        client_id=client_id, user_id=user_id, event=event, now=now
    )
