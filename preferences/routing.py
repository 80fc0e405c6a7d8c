"""Routing by users' preferences, for the apps above: which channel carries a notification
when it is created (`NotificationContent`, the notifications app's renderer) and again when it
is sent (`PreferenceRouter`, the worker's router). No ORM here.

Invariants protected here:
- a channel may carry an event to a user only if it is in the user's channel list, not
  disabled, the event is not muted, and it has an address (in_app's address is the user id);
  a new send (create or fallback) also needs a template for (event, channel);
- the user's order is the fallback order: a create uses the first usable channel and keeps
  the other usable ones, in order, as its fallbacks; no usable channel is a 422 naming the
  reason for every channel;
- every usable channel's template is rendered at create, so a payload that cannot fill a
  fallback is refused then (400), not discovered when the fallback is needed;
- the worker re-reads the preferences before each send (`PreferenceRouter`): a channel the
  user no longer allows is never sent on, and the current address is used; a whole claim's
  users are read in one statement, so the re-check's cost per claim does not grow with the
  number of users who have preferences.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from rest_framework import status as http

from notifyqueue.errors import DomainError, InvalidRequest
from notifyqueue.vocabulary import Channel
from preferences.repositories import PreferencesRecord, PreferencesRepository
from templates.repositories import TemplateRecord, TemplateRepository
from templates.services import Rendered, UnknownTemplate, template_render

log = logging.getLogger("notifyqueue.preferences")


class Refusal(StrEnum):
    """Why a channel cannot carry an event to a user."""

    OPTED_OUT = "opted_out"  # disabled, or not in the user's channel list
    MUTED = "muted"  # the user muted the event
    NO_ADDRESS = "no_address"
    NO_TEMPLATE = "no_template"


_REFUSAL_TEXT = {
    Refusal.OPTED_OUT: "opted out",
    Refusal.MUTED: "event muted",
    Refusal.NO_ADDRESS: "no address",
    Refusal.NO_TEMPLATE: "no template",
}


class NoUsableChannel(DomainError):
    code = "no_usable_channel"
    http_status = http.HTTP_422_UNPROCESSABLE_ENTITY

    def __init__(self, *, user_id: str, event: str, refusals: dict[str, Refusal]) -> None:
        if refusals:
            why = "; ".join(f"{ch}: {_REFUSAL_TEXT[r]}" for ch, r in refusals.items())
        else:
            why = "the user has no channels"
        super().__init__(
            f"No channel can carry {event!r} to user {user_id!r} ({why}).",
            fields={channel: [reason.value] for channel, reason in refusals.items()},
        )


class NoPreferences(DomainError):
    code = "no_preferences"
    http_status = http.HTTP_422_UNPROCESSABLE_ENTITY

    def __init__(self, user_id: str) -> None:
        super().__init__(
            f"User {user_id!r} has no preferences, so no channel is known; PUT "
            f"/api/v1/users/{user_id}/preferences first.",
            fields={"user_id": ["no_preferences"]},
        )


@dataclass(frozen=True)
class RenderedContent:
    """Where and what to send once any template and preferences have been applied."""

    channel: str
    recipient: str
    subject: str
    body: str
    fallback_channels: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Route:
    """A channel a preference-mode notification may go out on now, with what to send there."""

    channel: str
    recipient: str
    subject: str
    body: str
    # What is left to try after this channel, in the user's order.
    fallback_channels: tuple[str, ...]


@dataclass(frozen=True)
class SendRoutes:
    """What a user's current preferences allow a claimed notification at send time."""

    # Its own channel, at the user's current address; None when the user no longer allows it.
    current: Route | None
    # Only when `current` is None: the first of its fallbacks allowed now, rendered for it;
    # None when none is.
    fallback: Route | None = None


# The two Protocols below are what this app reads of the notifications app's create request
# and of the worker's claim; apps above preferences pass their own values in
# (docs/technical-design.md, Layers).


class ContentRequest(Protocol):
    """A create request to render (notifications' `NotificationRequest` is one)."""

    @property
    def channel(self) -> str | None: ...
    @property
    def recipient(self) -> str | None: ...
    @property
    def template(self) -> str | None: ...
    @property
    def payload(self) -> dict[str, Any] | None: ...
    @property
    def user_id(self) -> str | None: ...


class Routable(Protocol):
    """A claimed preference-mode notification (the worker's `Claim` is one)."""

    @property
    def id(self) -> uuid.UUID: ...
    @property
    def client_id(self) -> uuid.UUID: ...
    @property
    def user_id(self) -> str | None: ...
    @property
    def template(self) -> str | None: ...
    @property
    def payload(self) -> dict[str, Any] | None: ...
    @property
    def channel(self) -> str: ...
    @property
    def recipient(self) -> str: ...
    @property
    def subject(self) -> str: ...
    @property
    def body(self) -> str: ...
    @property
    def fallback_channels(self) -> tuple[str, ...]: ...


class PreferenceStore(Protocol):
    def get(self, *, client_id: uuid.UUID, user_id: str) -> PreferencesRecord | None: ...

    def get_many(
        self, *, users: Collection[tuple[uuid.UUID, str]]
    ) -> dict[tuple[uuid.UUID, str], PreferencesRecord]: ...


class TemplateLookup(Protocol):
    def get_many(
        self, *, client_id: uuid.UUID, event: str, channels: list[str]
    ) -> dict[str, TemplateRecord]: ...

    def get_each(
        self, *, keys: Collection[tuple[uuid.UUID, str, str]]
    ) -> dict[tuple[uuid.UUID, str, str], TemplateRecord]: ...


def channel_address(preferences: PreferencesRecord, channel: str) -> str | None:
    if channel == Channel.IN_APP:
        return preferences.user_id
    return preferences.addresses.get(channel) or None


def channel_refusal(preferences: PreferencesRecord, *, event: str, channel: str) -> Refusal | None:
    """Why `channel` may not carry `event` to this user now; None when it may."""
    if channel in preferences.disabled_channels or channel not in preferences.channels:
        return Refusal.OPTED_OUT
    if event in preferences.muted_events:
        return Refusal.MUTED
    if channel_address(preferences, channel) is None:
        return Refusal.NO_ADDRESS
    return None


class NotificationContent:
    """The renderer `notification_create` uses for a request with a template.

    With `channel` and `recipient` given, it renders that channel's template. In preference
    mode (`user_id`, no channel), it picks the channels from the user's preferences.
    """

    def __init__(
        self,
        *,
        preferences: PreferenceStore | None = None,
        templates: TemplateLookup | None = None,
    ) -> None:
        self.preferences = preferences or PreferencesRepository()
        self.templates = templates or TemplateRepository()

    def render(self, *, client_id: uuid.UUID, request: ContentRequest) -> RenderedContent:
        event = request.template or ""
        payload = request.payload or {}
        if request.channel is not None:
            found = self.templates.get_many(
                client_id=client_id, event=event, channels=[request.channel]
            )
            if request.channel not in found:
                raise UnknownTemplate(event=event, channel=request.channel)
            rendered = template_render(found[request.channel], payload)
            return RenderedContent(
                channel=request.channel,
                recipient=request.recipient or "",
                subject=rendered.subject,
                body=rendered.body,
            )
        return self._from_preferences(client_id, request.user_id or "", event, payload)

    def _from_preferences(
        self, client_id: uuid.UUID, user_id: str, event: str, payload: Mapping[str, Any]
    ) -> RenderedContent:
        preferences = self.preferences.get(client_id=client_id, user_id=user_id)
        if preferences is None:
            raise NoPreferences(user_id)
        templates = self.templates.get_many(
            client_id=client_id, event=event, channels=list(preferences.channels)
        )
        usable: list[str] = []
        refusals: dict[str, Refusal] = {}
        for channel in preferences.channels:
            refusal = channel_refusal(preferences, event=event, channel=channel)
            if refusal is None and channel not in templates:
                refusal = Refusal.NO_TEMPLATE
            if refusal is None:
                usable.append(channel)
            else:
                refusals[channel] = refusal
        if not usable:
            raise NoUsableChannel(user_id=user_id, event=event, refusals=refusals)
        rendered: dict[str, Rendered] = {
            ch: template_render(templates[ch], payload) for ch in usable
        }
        primary, *fallbacks = usable
        return RenderedContent(
            channel=primary,
            recipient=channel_address(preferences, primary) or "",
            subject=rendered[primary].subject,
            body=rendered[primary].body,
            fallback_channels=fallbacks,
        )


class PreferenceRouter:
    """The worker's view of users' preferences at send time (delivery.services.Router)."""

    def __init__(
        self,
        *,
        preferences: PreferenceStore | None = None,
        templates: TemplateLookup | None = None,
    ) -> None:
        self.preferences = preferences or PreferencesRepository()
        self.templates = templates or TemplateRepository()

    def routes_at_send(self, claims: Sequence[Routable]) -> dict[uuid.UUID, SendRoutes]:
        """Each claim's routes (by its id) under its user's preferences now: every user's
        preferences read in one statement, and, when some claims' channels are no longer
        allowed, their fallbacks' templates in one more."""
        users = {(claim.client_id, claim.user_id or "") for claim in claims}
        found = self.preferences.get_many(users=users)
        preferences = {
            claim.id: found.get((claim.client_id, claim.user_id or "")) for claim in claims
        }
        current = {claim.id: _route_current(claim, preferences[claim.id]) for claim in claims}
        rerouted = [
            claim
            for claim in claims
            if current[claim.id] is None
            and preferences[claim.id] is not None
            and claim.fallback_channels
        ]
        templates = self.templates.get_each(
            keys={
                (claim.client_id, claim.template or "", channel)
                for claim in rerouted
                for channel in claim.fallback_channels
            }
        )
        routes = {claim.id: SendRoutes(current=current[claim.id]) for claim in claims}
        for claim in rerouted:
            event = claim.template or ""
            routes[claim.id] = SendRoutes(
                current=None,
                fallback=_route_fallback(
                    claim,
                    preferences[claim.id],
                    {
                        channel: templates[key]
                        for channel in claim.fallback_channels
                        if (key := (claim.client_id, event, channel)) in templates
                    },
                ),
            )
        return routes

    def route_next(self, claim: Routable) -> Route | None:
        preferences = self.preferences.get(client_id=claim.client_id, user_id=claim.user_id or "")
        if preferences is None:
            return None
        templates = self.templates.get_many(
            client_id=claim.client_id,
            event=claim.template or "",
            channels=list(claim.fallback_channels),
        )
        return _route_fallback(claim, preferences, templates)


def _route_current(claim: Routable, preferences: PreferencesRecord | None) -> Route | None:
    """The claim's own channel, at the user's current address, if the user still allows it."""
    event = claim.template or ""
    if preferences is None or channel_refusal(preferences, event=event, channel=claim.channel):
        return None
    return Route(
        channel=claim.channel,
        recipient=channel_address(preferences, claim.channel) or claim.recipient,
        subject=claim.subject,
        body=claim.body,
        fallback_channels=claim.fallback_channels,
    )


def _route_fallback(
    claim: Routable, preferences: PreferencesRecord, templates: Mapping[str, TemplateRecord]
) -> Route | None:
    """The first of the claim's fallbacks the user allows now and `templates` (by channel)
    fills for its payload, rendered; None if none is."""
    event = claim.template or ""
    candidates = list(claim.fallback_channels)
    for position, channel in enumerate(candidates):
        if channel_refusal(preferences, event=event, channel=channel):
            continue
        if channel not in templates:
            continue
        try:
            rendered = template_render(templates[channel], claim.payload or {})
        except InvalidRequest as error:
            # The template was edited after the create and the payload no longer fills it.
            log.warning(
                "fallback skipped notification=%s channel=%s: %s",
                claim.id,
                channel,
                error.message,
            )
            continue
        return Route(
            channel=channel,
            recipient=channel_address(preferences, channel) or "",
            subject=rendered.subject,
            body=rendered.body,
            fallback_channels=tuple(candidates[position + 1 :]),
        )
    return None
