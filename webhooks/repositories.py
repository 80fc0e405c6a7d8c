"""The only code that reads or writes webhook events, their attempts and webhook secrets.

Invariants protected here:
- an event is claimed by one sender at a time (FOR UPDATE SKIP LOCKED in one statement that
  commits before any HTTP call, so no row lock is held while posting);
- a claim is ended only by the holder of its token while the event is DELIVERING; an event the
  finish does not return had its claim taken over (its worker died, or the claim expired), and
  its late result is dropped;
- nothing here writes the notification table: a webhook can never change a notification.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from django.db import transaction
from django.db.models import DateTimeField, F
from django.db.models.expressions import RawSQL

from clients.models import Client
from notifyqueue.sqlgateway import Queries

QUERIES = Queries(Path(__file__).with_name("sql") / "webhook_events.sql")


@dataclass(frozen=True)
class ClaimedEvent:
    id: uuid.UUID
    claim_token: uuid.UUID
    notification_id: uuid.UUID
    status: str
    attempt_count: int
    occurred_at: datetime
    delivery_attempts: int
    """Attempts since the event was created or an operator last redelivered it, this one
    included."""
    attempt_number: int
    """Attempts the event has ever had, this one included."""
    webhook_url: str
    webhook_secret: str
    previous_webhook_secret: str
    previous_webhook_secret_expires_at: datetime | None
    claimed_at: datetime
    """The database clock when the claim was made."""
    type: str = "status"
    """`status`, or `receipt.<type>` for a provider's delivery receipt."""
    receipt: str | None = None
    message_id: str | None = None


@dataclass(frozen=True)
class ReclaimedEvent:
    id: uuid.UUID
    state: str
    cause: str
    """Why the claim was taken: `dead_worker` or `claim_timeout`."""


def webhook_events_claim_due(
    *, limit: int, per_client: int, claim_timeout_s: float, worker: str | None = None
) -> list[ClaimedEvent]:
    """Claims up to `limit` due PENDING events, fairly across clients and at most
    `per_client` in flight per client, for `worker` (whose death hands them over; None: only
    their claim timeout does); the claim is committed when this returns."""
    with transaction.atomic():
        QUERIES.execute("webhook_event_claim_plan")
        return QUERIES.rows(
            "webhook_event_claim_due",
            row=ClaimedEvent,
            limit=limit,
            per_client=per_client,
            claim_timeout_s=claim_timeout_s,
            worker=worker,
        )


@dataclass(frozen=True)
class EventResult:
    """How one claim ended, for webhook_events_finish."""

    event_id: uuid.UUID
    claim_token: uuid.UUID
    state: str
    """DELIVERED, FAILED, or PENDING to be tried again."""
    outcome: str
    retry_in_s: float | None
    """PENDING: due again this long from now (database clock)."""
    status_code: int | None
    error: str | None
    duration_ms: int


def webhook_events_finish(results: list[EventResult]) -> set[uuid.UUID]:
    """Ends each claim and its attempt row, all in one statement and one transaction. Returns
    the ids of the events whose claim was still theirs; a result missing from it came after
    its claim was taken over, and changed nothing."""
    if not results:
        return set()
    with transaction.atomic():
        return set(
            QUERIES.scalars(
                "webhook_events_finish",
                event_ids=[r.event_id for r in results],
                claim_tokens=[r.claim_token for r in results],
                states=[r.state for r in results],
                outcomes=[r.outcome for r in results],
                retry_in_s=[r.retry_in_s for r in results],
                status_codes=[r.status_code for r in results],
                errors=[r.error for r in results],
                durations_ms=[r.duration_ms for r in results],
            )
        )


def webhook_events_reclaim_expired(
    *, limit: int, max_attempts: int, dead_after_s: float | None
) -> list[ReclaimedEvent]:
    """Returns DELIVERING claims of dead workers (no heartbeat for `dead_after_s`; None: not
    looked for) and expired ones to PENDING (or FAILED on their last attempt)."""
    with transaction.atomic():
        return QUERIES.rows(
            "webhook_event_reclaim_expired",
            row=ReclaimedEvent,
            limit=limit,
            max_attempts=max_attempts,
            dead_after_s=dead_after_s,
        )


def webhook_events_redeliver(*, event_ids: list[uuid.UUID]) -> list[uuid.UUID]:
    """Makes the DELIVERED or FAILED events among `event_ids` due again; returns their ids."""
    with transaction.atomic():
        return QUERIES.scalars("webhook_event_redeliver", event_ids=list(event_ids))


@dataclass(frozen=True)
class ReceiptEvent:
    """A provider's receipt to report to its notification's client (plain values, from the
    receipts app above)."""

    client_id: uuid.UUID
    notification_id: uuid.UUID
    status: str
    attempt_count: int
    occurred_at: datetime
    receipt: str
    message_id: str


def webhook_receipt_events_add(events: list[ReceiptEvent]) -> list[uuid.UUID]:
    """Writes one event of type `receipt.<type>` per receipt whose client has a webhook URL, in
    the caller's transaction (the one that applies the receipts); returns their ids."""
    if not events:
        return []
    return QUERIES.scalars(
        "webhook_receipt_events_add",
        client_ids=[e.client_id for e in events],
        notification_ids=[e.notification_id for e in events],
        statuses=[e.status for e in events],
        attempt_counts=[e.attempt_count for e in events],
        occurred_ats=[e.occurred_at for e in events],
        receipts=[e.receipt for e in events],
        message_ids=[e.message_id for e in events],
    )


def client_webhook_secret_replace(
    *, client_id: uuid.UUID, new_secret: str, overlap: timedelta
) -> bool:
    """Makes `new_secret` current and keeps the old one for `overlap` (database clock).

    One UPDATE, so the old secret is read and moved atomically even if two operators rotate
    at once. False when there is no such client.
    """
    changed = Client.objects.filter(id=client_id).update(
        previous_webhook_secret=F("webhook_secret"),
        previous_webhook_secret_expires_at=RawSQL(
            "notifyqueue_now() + %s", [overlap], output_field=DateTimeField()
        ),
        webhook_secret=new_secret,
    )
    return changed == 1
