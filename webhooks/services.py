"""Webhook delivery rules: what is sent, how it is signed, when it is retried, when it stops.

Invariants protected here:
- at-least-once: an event is retried until a 2xx answer, NOTIFYQUEUE_WEBHOOK_MAX_ATTEMPTS
  attempts, or a refused URL; a sender that dies mid-POST is covered by the reaper, and the
  receiver deduplicates by eventId (the `webhook-id` header), which never changes;
- isolation: each step handles at most one batch, every POST ends within the webhook timeout,
  and nothing here touches a notification;
- the body is exactly the contract's five fields, and the signature covers those bytes.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.utils import timezone
from standardwebhooks.webhooks import Webhook

from clients.models import webhook_secret_new
from monitoring import metrics
from webhooks import repositories
from webhooks.models import AttemptOutcome, DeliveryState
from webhooks.repositories import ClaimedEvent, ReclaimedEvent
from webhooks.sender import PostResult, webhook_post

logger = logging.getLogger(__name__)

PREVIOUS_SECRET_OVERLAP = timedelta(hours=24)
RECLAIM_BATCH = 1000


@dataclass(frozen=True)
class WebhookBatch:
    """What one sender step did."""

    claimed: int = 0
    delivered: int = 0
    retrying: int = 0
    failed: int = 0
    stale: int = 0
    """Results dropped because the claim had been taken over meanwhile."""


def webhook_backoff_seconds(
    *, attempt: int, base_s: float, max_s: float, rng: Callable[[], float] = random.random
) -> float:
    """The wait after failed attempt `attempt` (1-based): between base·2^(n-1) and base·2^n.

    The same curve as notification retries (contract section 2: the first retry waits
    base..2*base, then doubles), capped at `max_s`; the random part spreads out the retries
    of many events that failed in the same outage.
    """
    upper = min(max_s, base_s * 2.0 ** min(attempt, 62))
    return upper / 2 + rng() * upper / 2


def webhook_event_body(event: ClaimedEvent) -> bytes:
    """The contract's JSON body; the timestamp is when the status changed, RFC 3339 in UTC."""
    occurred = event.occurred_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return json.dumps(
        {
            "eventId": str(event.id),
            "jobId": str(event.notification_id),
            "status": event.status,
            "attemptCount": event.attempt_count,
            "timestamp": occurred,
        },
        separators=(",", ":"),
    ).encode()


def webhook_signing_secrets(event: ClaimedEvent, *, now: datetime) -> list[str]:
    """The current secret, plus the previous one while its rotation overlap lasts."""
    secrets = [event.webhook_secret]
    expires = event.previous_webhook_secret_expires_at
    if event.previous_webhook_secret and expires is not None and now < expires:
        secrets.append(event.previous_webhook_secret)
    return secrets


def webhook_signature_headers(
    *, event_id: uuid.UUID, body: bytes, secrets: list[str], sent_at: datetime
) -> dict[str, str]:
    """Standard Webhooks headers: one `v1,<base64>` signature per secret, space-separated."""
    text = body.decode()
    signatures = [
        Webhook(secret).sign(msg_id=str(event_id), timestamp=sent_at, data=text)
        for secret in secrets
    ]
    return {
        "webhook-id": str(event_id),
        "webhook-timestamp": str(math.floor(sent_at.timestamp())),
        "webhook-signature": " ".join(signatures),
    }


def _post(event: ClaimedEvent, *, now: datetime) -> PostResult:
    if not event.webhook_url:
        return PostResult(False, True, None, "the client has no webhook URL any more", 0.0)
    body = webhook_event_body(event)
    # The signed timestamp is the real sending time, whatever `now` the step was given:
    # receivers reject signatures whose timestamp is far from their own clock.
    headers = webhook_signature_headers(
        event_id=event.id,
        body=body,
        secrets=webhook_signing_secrets(event, now=now),
        sent_at=datetime.now(UTC),
    )
    return webhook_post(
        url=event.webhook_url,
        body=body,
        headers=headers,
        timeout_s=settings.NOTIFYQUEUE_WEBHOOK_TIMEOUT_SECONDS,
        allow_private=settings.NOTIFYQUEUE_WEBHOOK_ALLOW_PRIVATE,
    )


def _record(event: ClaimedEvent, result: PostResult, *, finished_at: datetime) -> str | None:
    """Writes the attempt's result; returns the event's new state, or None if the claim was lost."""
    next_attempt_at = None
    if result.delivered:
        state, outcome = DeliveryState.DELIVERED, AttemptOutcome.DELIVERED
    elif result.permanent:
        state, outcome = DeliveryState.FAILED, AttemptOutcome.PERMANENT_FAILURE
    elif event.delivery_attempts >= settings.NOTIFYQUEUE_WEBHOOK_MAX_ATTEMPTS:
        state, outcome = DeliveryState.FAILED, AttemptOutcome.TEMPORARY_FAILURE
    else:
        state, outcome = DeliveryState.PENDING, AttemptOutcome.TEMPORARY_FAILURE
        wait_s = webhook_backoff_seconds(
            attempt=event.delivery_attempts,
            base_s=settings.NOTIFYQUEUE_BACKOFF_BASE_SECONDS,
            max_s=settings.NOTIFYQUEUE_BACKOFF_MAX_SECONDS,
        )
        next_attempt_at = finished_at + timedelta(seconds=wait_s)
    finished = repositories.webhook_event_finish(
        event_id=event.id,
        claim_token=event.claim_token,
        state=state,
        outcome=outcome,
        finished_at=finished_at,
        next_attempt_at=next_attempt_at,
        status_code=result.status_code,
        error=result.error,
        duration_ms=round(result.duration_s * 1000),
    )
    if not finished:
        logger.warning(
            "webhook event %s: claim %s was taken over before its result (%s) was recorded",
            event.id,
            event.claim_token,
            outcome,
        )
        return None
    metrics.webhook_attempt_recorded(outcome=outcome, state=state)
    if state != DeliveryState.DELIVERED:
        logger.info(
            "webhook event %s attempt %s: %s -> %s",
            event.id,
            event.attempt_number,
            result.error,
            state,
        )
    return state


def webhook_events_deliver_due(
    *, now: datetime | None = None, limit: int | None = None
) -> WebhookBatch:
    """The sender's step: claims one batch of due events, POSTs them, records each result.

    Takes at most about ceil(limit / NOTIFYQUEUE_WEBHOOK_CONCURRENCY) x the webhook timeout:
    POSTs run on a small thread pool so one slow receiver does not hold up the others, and
    each is cut off at the timeout. Results are recorded on the calling thread's connection.
    """
    now = now or timezone.now()
    limit = limit or settings.NOTIFYQUEUE_WEBHOOK_BATCH_SIZE
    started = time.monotonic()
    events = repositories.webhook_events_claim_due(
        now=now, limit=limit, claim_timeout_s=settings.NOTIFYQUEUE_WEBHOOK_CLAIM_TIMEOUT_SECONDS
    )
    if not events:
        return WebhookBatch()
    counts = {DeliveryState.DELIVERED: 0, DeliveryState.PENDING: 0, DeliveryState.FAILED: 0}
    stale = 0
    workers = min(settings.NOTIFYQUEUE_WEBHOOK_CONCURRENCY, len(events))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="webhook-post") as pool:
        futures = {pool.submit(_post, event, now=now): event for event in events}
        for future in as_completed(futures):
            event = futures[future]
            try:
                result = future.result()
            except Exception as exc:
                # A bug while building the request must not strand the claim until it expires.
                logger.exception("webhook event %s: POST raised", event.id)
                result = PostResult(False, False, None, f"{type(exc).__name__}: {exc}", 0.0)
            finished_at = now + timedelta(seconds=time.monotonic() - started)
            state = _record(event, result, finished_at=finished_at)
            if state is None:
                stale += 1
            else:
                counts[state] += 1
    return WebhookBatch(
        claimed=len(events),
        delivered=counts[DeliveryState.DELIVERED],
        retrying=counts[DeliveryState.PENDING],
        failed=counts[DeliveryState.FAILED],
        stale=stale,
    )


def webhook_events_reclaim_expired(
    *, now: datetime | None = None, limit: int = RECLAIM_BATCH
) -> list[ReclaimedEvent]:
    """The reaper's step: returns events whose sender died mid-delivery to the queue.

    Returns the events it released, each with its new state (PENDING, or FAILED when the
    expired claim was the event's last attempt).
    """
    reclaimed = repositories.webhook_events_reclaim_expired(
        now=now or timezone.now(),
        limit=limit,
        max_attempts=settings.NOTIFYQUEUE_WEBHOOK_MAX_ATTEMPTS,
    )
    for event in reclaimed:
        logger.warning("webhook event %s: claim expired, now %s", event.id, event.state)
    return reclaimed


def webhook_events_redeliver(
    *, event_ids: list[uuid.UUID], now: datetime | None = None
) -> list[uuid.UUID]:
    """An operator's redelivery of DELIVERED or FAILED events, with a fresh set of attempts.

    Returns the ids that were queued; events still PENDING or DELIVERING are left as they are.
    The receiver sees the same eventId again.
    """
    return repositories.webhook_events_redeliver(event_ids=event_ids, now=now or timezone.now())


def client_webhook_secret_rotate(*, client_id: uuid.UUID, now: datetime | None = None) -> bool:
    """Gives the client a new secret; the old one keeps signing alongside it for 24 hours.

    During the overlap every webhook carries two signatures, so a receiver verifies with
    either secret and can switch when it likes. A second rotation within the overlap retires
    the oldest secret at once.
    """
    return repositories.client_webhook_secret_replace(
        client_id=client_id,
        new_secret=webhook_secret_new(),
        previous_expires_at=(now or timezone.now()) + PREVIOUS_SECRET_OVERLAP,
    )
