"""Provider delivery receipts: how a signed provider event is checked, recorded once, and
applied to the message it names.

Invariants protected here:
- only an event signed with its channel's secret (Standard Webhooks: `webhook-id`,
  `webhook-timestamp`, `webhook-signature`), whose timestamp is within
  NOTIFYQUEUE_RECEIPT_TOLERANCE_SECONDS of this process's clock, and whose id this channel has
  not accepted before, changes anything; the timestamp is the sender's signing time, so it is
  compared with the receiving process's clock, as every Standard Webhooks receiver does;
- a receipt is recorded once and applied once, to the SENT attempt on its own channel that
  has exactly its message id: a channel's secret can reach only that channel's messages;
- a receipt that arrives before the worker has recorded its attempt's result is kept pending
  and applied by whichever comes second: the arrival, which looks again after its own commit,
  or the worker's finish, which looks after its commit (each writes, commits, then reads the
  other's write, so at least one of them sees both); the upkeep's sweep covers a process that
  died between the two;
- applying a receipt sets the notification's `receipt` (a bounce or a complaint stays),
  suppresses the address (a hard bounce for every client; a complaint or an opt-out for the
  message's client) and writes its webhook event, all in one transaction; the notification's
  status never changes (SENT stays the final delivery status).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import transaction
from rest_framework import status
from standardwebhooks.webhooks import Webhook

from delivery.receipts.models import STICKY_TYPES, Bounce, ReceiptType
from delivery.receipts.repositories import (
    MatchedReceipt,
    PendingPosition,
    ReceiptRecord,
    ReceiptRepository,
)
from monitoring import metrics
from notifyqueue.errors import DomainError
from suppressions.models import Reason
from suppressions.services import suppression_add
from webhooks.repositories import ReceiptEvent, webhook_receipt_events_add

log = logging.getLogger("notifyqueue.receipts")

EVENT_ID_MAX_CHARS = 255
SIGNATURE_HEADER_MAX_CHARS = 4096
# The most receipts one notification can have: one per type and bounce kind.
RECEIPTS_PER_NOTIFICATION_MAX = 16


class EventRefused(DomainError):
    """A forged, malformed or stale signature."""

    code = "invalid_signature"
    http_status = status.HTTP_401_UNAUTHORIZED


class EventReplayed(DomainError):
    code = "replayed_event"
    http_status = status.HTTP_409_CONFLICT


def provider_event_verify(
    *,
    secrets: Sequence[str],
    headers: dict[str, str],
    body: bytes,
    now: datetime,
    tolerance_s: float,
) -> str:
    """The event's id, once its signature (by any of `secrets`) and timestamp are good; else
    EventRefused, saying which without quoting what was sent."""
    event_id = headers.get("webhook-id") or ""
    timestamp = headers.get("webhook-timestamp") or ""
    signatures = headers.get("webhook-signature") or ""
    if not (event_id and timestamp and signatures):
        raise EventRefused("webhook-id, webhook-timestamp and webhook-signature are required.")
    if len(event_id) > EVENT_ID_MAX_CHARS or not event_id.isprintable() or not event_id.isascii():
        raise EventRefused(f"webhook-id: 1 to {EVENT_ID_MAX_CHARS} printable ASCII characters.")
    if len(signatures) > SIGNATURE_HEADER_MAX_CHARS:
        raise EventRefused("webhook-signature is too long.")
    if not (timestamp.isascii() and timestamp.isdigit() and len(timestamp) <= 12):
        raise EventRefused("webhook-timestamp: seconds since the epoch.")
    signed_at = datetime.fromtimestamp(int(timestamp), tz=UTC)
    expected = [
        Webhook(secret).sign(msg_id=event_id, timestamp=signed_at, data=body).encode()
        for secret in secrets
    ]
    given = [s.encode() for s in signatures.split(" ") if s.startswith("v1,")]
    if not any(hmac.compare_digest(e, g) for e in expected for g in given):
        raise EventRefused("No signature matches.")
    # Checked after the signature: an unsigned request learns nothing about the clock.
    if abs((now - signed_at).total_seconds()) > tolerance_s:
        raise EventRefused(
            f"webhook-timestamp is more than {tolerance_s:g} seconds from the server's clock."
        )
    return event_id


def provider_secret_problem(secret: str) -> str | None:
    """Why `secret` cannot sign, or None (a `whsec_` prefix, then base64 of 16-64 bytes)."""
    raw = secret.removeprefix("whsec_")
    try:
        key = base64.b64decode(raw + "==", validate=False)
    except (binascii.Error, ValueError):
        return "not base64"
    if not 16 <= len(key) <= 64:
        return "the key must be 16 to 64 bytes"
    return None


@dataclass(frozen=True)
class Recorded:
    """What a receipt did: `applied` (its notification was found), `pending` (kept until the
    attempt's result is recorded) or `duplicate` (recorded before; nothing changed)."""

    result: str
    notification_id: uuid.UUID | None = None


def receipt_record(
    *,
    channel: str,
    event_id: str,
    message_id: str,
    type: str,
    bounce: str | None,
    occurred_at: datetime,
    repository: ReceiptRepository | None = None,
) -> Recorded:
    """Records a verified event's receipt once and applies it when its attempt is known."""
    repository = repository or ReceiptRepository()
    with transaction.atomic():
        if not repository.event_accept(channel=channel, event_id=event_id):
            raise EventReplayed("This event id was accepted before.")
        receipt_id = repository.add(
            channel=channel,
            message_id=message_id,
            type=type,
            bounce=bounce,
            occurred_at=occurred_at,
            event_id=event_id,
        )
        if receipt_id is None:
            return Recorded("duplicate")
        metrics.receipt_recorded(channel=channel, type=type)
        applied = _apply(repository.match_messages([(channel, message_id)]), repository)
    if applied:
        return Recorded("applied", applied[0].notification_id)
    # Committed as pending; a finish that committed meanwhile looked before this commit, so
    # look again now (see the module docstring).
    with transaction.atomic():
        applied = _apply(repository.match_messages([(channel, message_id)]), repository)
    if applied:
        return Recorded("applied", applied[0].notification_id)
    log.info(
        "receipt pending channel=%s type=%s (no SENT attempt with its message id yet)",
        channel,
        type,
    )
    return Recorded("pending")


def receipts_match_finished(
    keys: Iterable[tuple[str, str]], *, repository: ReceiptRepository | None = None
) -> int:
    """After a finish committed: applies the pending receipts of its sent messages'
    (channel, message id) pairs. Returns how many were applied."""
    repository = repository or ReceiptRepository()
    keys = list(keys)
    if not keys:
        return 0
    with transaction.atomic():
        return len(_apply(repository.match_messages(keys), repository))


def receipts_sweep(
    *, after: PendingPosition | None, limit: int, repository: ReceiptRepository | None = None
) -> tuple[int, PendingPosition | None]:
    """Applies whichever of the next `limit` pending receipts (after `after`) now match.
    Returns how many were applied and the position to continue from (None: start over)."""
    repository = repository or ReceiptRepository()
    page = repository.pending_page(after=after, limit=limit)
    if not page:
        return 0, None
    with transaction.atomic():
        applied = _apply(repository.match_ids([p.id for p in page]), repository)
    return len(applied), (page[-1] if len(page) == limit else None)


def receipts_prune(
    *,
    pending_age_s: float,
    seen_age_s: float,
    limit: int,
    repository: ReceiptRepository | None = None,
) -> int:
    return (repository or ReceiptRepository()).prune(
        pending_age_s=pending_age_s, seen_age_s=seen_age_s, limit=limit
    )


def notification_receipts(
    *, notification_id: uuid.UUID, client_id: uuid.UUID | None
) -> list[ReceiptRecord] | None:
    """A notification's receipts; None when it does not exist or is another client's
    (`client_id` None: an operator, any client's)."""
    repository = ReceiptRepository()
    if not repository.notification_visible(notification_id=notification_id, client_id=client_id):
        return None
    return repository.of_notification(
        notification_id=notification_id, client_id=client_id, limit=RECEIPTS_PER_NOTIFICATION_MAX
    )


def receipt_suppression(receipt: MatchedReceipt) -> tuple[str, uuid.UUID | None] | None:
    """What a receipt suppresses: (reason, client) — None for every client — or nothing."""
    if receipt.type == ReceiptType.BOUNCED and receipt.bounce == Bounce.HARD:
        return Reason.HARD_BOUNCE, None
    if receipt.type == ReceiptType.COMPLAINED:
        return Reason.COMPLAINT, receipt.client_id
    if receipt.type == ReceiptType.OPTED_OUT:
        return Reason.OPTED_OUT, receipt.client_id
    return None


def receipt_latest(current: str | None, type: str) -> str:
    """A notification's receipt after one more: a bounce or a complaint stays."""
    return current if current in STICKY_TYPES else type


def _apply(matched: list[MatchedReceipt], repository: ReceiptRepository) -> list[MatchedReceipt]:
    """In the caller's transaction: the notifications' latest receipts, the suppressions and
    the webhook events of receipts just tied to their notification."""
    if not matched:
        return matched
    matched = sorted(matched, key=lambda r: (r.received_at, r.id))
    latest: dict[uuid.UUID, str] = {}
    for receipt in matched:
        latest[receipt.notification_id] = receipt_latest(
            latest.get(receipt.notification_id), receipt.type
        )
        suppression = receipt_suppression(receipt)
        if suppression is not None:
            reason, client_id = suppression
            suppression_add(
                channel=receipt.channel,
                recipient=receipt.recipient,
                client_id=client_id,
                reason=reason,
                source=f"receipt {receipt.message_id}",
            )
    repository.notification_receipts_set(latest)
    webhook_receipt_events_add(
        [
            ReceiptEvent(
                client_id=r.client_id,
                notification_id=r.notification_id,
                status=r.status,
                attempt_count=r.attempt_count,
                occurred_at=r.occurred_at,
                receipt=r.type,
                message_id=r.message_id,
            )
            for r in matched
            if r.hooked
        ]
    )
    for receipt in matched:
        log.debug(
            "receipt applied notification=%s client=%s channel=%s type=%s bounce=%s",
            receipt.notification_id,
            receipt.client_id,
            receipt.channel,
            receipt.type,
            receipt.bounce,
        )
    return matched
