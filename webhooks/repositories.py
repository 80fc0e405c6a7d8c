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
from dataclasses import dataclass, fields
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
    client_id: uuid.UUID
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


@dataclass(frozen=True)
class _StepRow:
    """A row of webhook_events_step: a finished event (only `id` set) or a claimed one."""

    finished: bool
    id: uuid.UUID
    claim_token: uuid.UUID | None
    client_id: uuid.UUID | None
    notification_id: uuid.UUID | None
    status: str | None
    attempt_count: int | None
    occurred_at: datetime | None
    delivery_attempts: int | None
    attempt_number: int | None
    webhook_url: str | None
    webhook_secret: str | None
    previous_webhook_secret: str | None
    previous_webhook_secret_expires_at: datetime | None
    claimed_at: datetime | None
    type: str | None
    receipt: str | None
    message_id: str | None


_CLAIMED_FIELDS = [f.name for f in fields(ClaimedEvent)]


def webhook_events_step(
    results: list[EventResult],
    *,
    limit: int,
    per_client: int,
    claim_timeout_s: float,
    worker: str | None,
) -> tuple[set[uuid.UUID], list[ClaimedEvent]]:
    """A sender's step in one statement and one transaction: ends each claim in `results` and
    its attempt row, then claims up to `limit` due PENDING events (0: none), fairly across
    clients, at most `per_client` DELIVERING per client and none of a client whose events
    another sender holds, for `worker` (whose death hands them over; None: only their claim
    timeout does). Returns the ids of the events whose claim was still theirs (a result
    missing from it came after its claim was taken over, and changed nothing) and the claimed
    events, committed when this returns. The commit does not wait for the disk
    (webhooks/sql/functions/webhook_events_step.sql says why that is safe)."""
    rows = QUERIES.rows(
        "webhook_events_step",
        row=_StepRow,
        event_ids=[r.event_id for r in results],
        claim_tokens=[r.claim_token for r in results],
        states=[r.state for r in results],
        outcomes=[r.outcome for r in results],
        retry_in_s=[r.retry_in_s for r in results],
        status_codes=[r.status_code for r in results],
        errors=[r.error for r in results],
        durations_ms=[r.duration_ms for r in results],
        limit=limit,
        per_client=per_client,
        claim_timeout_s=claim_timeout_s,
        worker=worker,
    )
    finished = {row.id for row in rows if row.finished}
    claimed = [
        ClaimedEvent(**{name: getattr(row, name) for name in _CLAIMED_FIELDS})
        for row in rows
        if not row.finished
    ]
    return finished, claimed


def webhook_events_claim_due(
    *, limit: int, per_client: int, claim_timeout_s: float, worker: str | None = None
) -> list[ClaimedEvent]:
    """webhook_events_step with no results: claims up to `limit` due events."""
    _, claimed = webhook_events_step(
        [], limit=limit, per_client=per_client, claim_timeout_s=claim_timeout_s, worker=worker
    )
    return claimed


def webhook_events_finish(results: list[EventResult]) -> set[uuid.UUID]:
    """webhook_events_step with no claim: ends each claim and its attempt row; returns the ids
    of the events whose claim was still theirs."""
    if not results:
        return set()
    finished, _ = webhook_events_step(
        results, limit=0, per_client=0, claim_timeout_s=0, worker=None
    )
    return finished


def webhook_events_release(events: list[ClaimedEvent]) -> set[uuid.UUID]:
    """Gives back claims whose POST never started: PENDING again, their attempt not counted
    and its row removed. Returns the ids released (a claim taken over meanwhile is not)."""
    if not events:
        return set()
    with transaction.atomic():
        return set(
            QUERIES.scalars(
                "webhook_events_release",
                event_ids=[e.id for e in events],
                claim_tokens=[e.claim_token for e in events],
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
