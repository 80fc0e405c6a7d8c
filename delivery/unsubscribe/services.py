"""One-click unsubscribe (RFC 8058, RFC 2369): the link every non-CRITICAL email carries, and
what a click on it does.

Invariants protected here:
- a link names exactly one (client, user, event), or for a direct recipient one (client,
  address), inside a token signed with NOTIFYQUEUE_UNSUBSCRIBE_SECRET (django.core.signing;
  earlier keys in NOTIFYQUEUE_UNSUBSCRIBE_SECRET_FALLBACKS still verify while a key is
  rotated): a tampered token, or one whose parts were moved to another user, verifies as
  nothing and changes nothing;
- a token works for NOTIFYQUEUE_UNSUBSCRIBE_TOKEN_DAYS (at least 60) after it was signed. Its
  signing time is the sending worker's clock and its age is judged by the API's clock: the
  two processes' clocks need only agree to within a small part of that period;
- an unsubscribe mutes that event for that user through the user's preferences (so whatever
  is already queued for it is suppressed at its send-time check), or suppresses the direct
  address for that client only; doing it again changes nothing.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.core import signing
from django.db import IntegrityError
from django.utils import timezone

from notifyqueue.vocabulary import Channel, Priority
from preferences.services import preferences_event_mute
from suppressions.models import Reason
from suppressions.services import suppression_add

SALT = "notifyqueue.unsubscribe"
MIN_TOKEN_DAYS = 60
ONE_CLICK = "List-Unsubscribe=One-Click"


@dataclass(frozen=True)
class Unsubscribe:
    """What a link unsubscribes: `event` for `user_id`, or the direct `address`."""

    client_id: uuid.UUID
    user_id: str | None = None
    event: str | None = None
    address: str | None = None


class TokenInvalid(Exception):
    """Tampered, signed with no key this process accepts, expired, or not a token."""


def unsubscribe_token(target: Unsubscribe) -> str:
    if target.user_id is not None:
        payload = {"c": str(target.client_id), "u": target.user_id, "e": target.event}
    else:
        payload = {"c": str(target.client_id), "a": target.address}
    return signing.dumps(
        payload, key=settings.NOTIFYQUEUE_UNSUBSCRIBE_SECRET, salt=SALT, compress=True
    )


def unsubscribe_token_read(token: str) -> Unsubscribe:
    try:
        payload = signing.loads(
            token,
            key=settings.NOTIFYQUEUE_UNSUBSCRIBE_SECRET,
            fallback_keys=settings.NOTIFYQUEUE_UNSUBSCRIBE_SECRET_FALLBACKS,
            salt=SALT,
            max_age=timedelta(days=settings.NOTIFYQUEUE_UNSUBSCRIBE_TOKEN_DAYS),
        )
        client_id = uuid.UUID(payload["c"])
        if "u" in payload:
            if not (isinstance(payload["u"], str) and isinstance(payload["e"], str)):
                raise TypeError("not a user and an event")
            return Unsubscribe(client_id, user_id=payload["u"], event=payload["e"])
        if not isinstance(payload["a"], str):
            raise TypeError("not an address")
        return Unsubscribe(client_id, address=payload["a"])
    except (signing.BadSignature, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise TokenInvalid(str(exc)) from exc


def unsubscribe_headers(
    *,
    client_id: uuid.UUID,
    channel: str,
    priority: int,
    recipient: str,
    user_id: str | None,
    template: str | None,
) -> dict[str, str]:
    """The List-Unsubscribe headers of one email (RFC 8058); none for another channel, for a
    CRITICAL email, or without NOTIFYQUEUE_PUBLIC_URL (and its secret)."""
    base = settings.NOTIFYQUEUE_PUBLIC_URL
    if (
        channel != Channel.EMAIL
        or priority == Priority.CRITICAL
        or not base
        or not settings.NOTIFYQUEUE_UNSUBSCRIBE_SECRET
    ):
        return {}
    if user_id is not None and template is not None:
        target = Unsubscribe(client_id, user_id=user_id, event=template)
    else:
        target = Unsubscribe(client_id, address=recipient)
    return {
        "List-Unsubscribe": f"<{base}/unsubscribe/{unsubscribe_token(target)}>",
        "List-Unsubscribe-Post": ONE_CLICK,
    }


def unsubscribe_apply(target: Unsubscribe) -> bool:
    """Mutes the event for the user, or suppresses the address for the client. True when
    this call changed something (False: it was done before)."""
    if target.user_id is not None and target.event is not None:
        return preferences_event_mute(
            client_id=target.client_id,
            user_id=target.user_id,
            event=target.event,
            now=timezone.now(),
        )
    try:
        _, created = suppression_add(
            channel=Channel.EMAIL,
            recipient=target.address or "",
            client_id=target.client_id,
            reason=Reason.UNSUBSCRIBED,
            source="unsubscribe link",
        )
    except IntegrityError:
        # The client was deleted since the email was sent: nothing of it is left to stop.
        return False
    return created
