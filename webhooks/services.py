"""Webhook delivery rules: what is sent, how it is signed, when it is retried, when it stops.

Invariants protected here:
- at-least-once: an event is retried on NOTIFYQUEUE_WEBHOOK_RETRY_SCHEDULE (due times on the
  database clock) until a 2xx answer, NOTIFYQUEUE_WEBHOOK_MAX_ATTEMPTS attempts, or a
  refused URL; a sender that dies mid-POST is covered by the reaper (at once when its
  worker's heartbeat stops, else at the claim timeout), and the
  receiver deduplicates by eventId (the `webhook-id` header), which never changes;
- isolation: every POST ends within the webhook timeout, one client holds at most
  NOTIFYQUEUE_WEBHOOK_CLIENT_CONCURRENCY POSTs at once, and nothing here touches a
  notification;
- the body is exactly the contract's fields (five, plus `type`, and a receipt's `receipt` and
  `message_id`), and the signature covers those bytes.
"""

from __future__ import annotations

import json
import logging
import math
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from django.conf import settings
from standardwebhooks.webhooks import Webhook

from clients.models import webhook_secret_new
from monitoring import metrics
from notifyqueue.backoff import jittered
from webhooks import repositories
from webhooks.models import AttemptOutcome, DeliveryState
from webhooks.post import PostResult, webhook_post
from webhooks.repositories import ClaimedEvent, EventResult, ReclaimedEvent

logger = logging.getLogger(__name__)

PREVIOUS_SECRET_OVERLAP = timedelta(hours=24)
RECLAIM_BATCH = 1000
# A sender claims at most this many rounds of a client's POST slots ahead
# (webhook_claim_ahead_rounds).
CLAIM_AHEAD_ROUNDS_MAX = 16
# While every client's lane has events waiting, a sender still claims this often, so that
# another client's first events are not left waiting behind them.
CLAIM_INTERVAL_S = 0.02
# Each retry wait is its scheduled step ±10%.
RETRY_JITTER = 0.1


@dataclass(frozen=True)
class WebhookBatch:
    """What one sender step did."""

    claimed: int = 0
    delivered: int = 0
    retrying: int = 0
    failed: int = 0
    stale: int = 0
    """Results dropped because the claim had been taken over meanwhile."""


def webhook_retry_wait_seconds(
    *, attempt: int, schedule: list[float], rng: Callable[[], float] = random.random
) -> float:
    """The wait after failed attempt `attempt` (1-based), from the retry schedule.

    schedule[n] is the wait before attempt n + 1 (schedule[0] stands for the first attempt,
    made as soon as the event is written); past the schedule's end its last step repeats.
    Each wait is spread by ±RETRY_JITTER, so the retries of many events that failed in the
    same outage do not all arrive at the same instant. This is Standard Webhooks' fixed
    schedule, not the delivery worker's exponential backoff (delivery.services.RetryPolicy):
    the two are different on purpose and share only the jitter (notifyqueue.backoff).
    """
    step = schedule[min(attempt, len(schedule) - 1)]
    return max(0.0, jittered(step, low=1 - RETRY_JITTER, high=1 + RETRY_JITTER, rng=rng))


def webhook_event_body(event: ClaimedEvent) -> bytes:
    """The contract's JSON body: the five fields of a status change plus `type` (`status`);
    a receipt's event adds `receipt` and `message_id`, its `status` the notification's at the
    receipt. The timestamp is when the status changed or the receipt was applied, RFC 3339 in
    UTC."""
    occurred = event.occurred_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = {
        "eventId": str(event.id),
        "jobId": str(event.notification_id),
        "status": event.status,
        "attemptCount": event.attempt_count,
        "timestamp": occurred,
        "type": event.type,
    }
    if event.type != "status":
        body |= {"receipt": event.receipt, "message_id": event.message_id}
    return json.dumps(body, separators=(",", ":")).encode()


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


def _post(event: ClaimedEvent) -> PostResult:
    if not event.webhook_url:
        return PostResult(False, True, None, "the client has no webhook URL any more", 0.0)
    body = webhook_event_body(event)
    # The rotation overlap is judged on the database clock (the claim's time); the signed
    # timestamp is the real sending time: receivers compare it with their own clock.
    headers = webhook_signature_headers(
        event_id=event.id,
        body=body,
        secrets=webhook_signing_secrets(event, now=event.claimed_at),
        sent_at=datetime.now(UTC),
    )
    return webhook_post(
        url=event.webhook_url,
        body=body,
        headers=headers,
        timeout_s=settings.NOTIFYQUEUE_WEBHOOK_TIMEOUT_SECONDS,
        allow_private=settings.NOTIFYQUEUE_WEBHOOK_ALLOW_PRIVATE,
    )


def _result(event: ClaimedEvent, result: PostResult) -> EventResult:
    """How the attempt ends the claim: delivered, given up, or tried again after backoff."""
    retry_in_s = None
    if result.delivered:
        state, outcome = DeliveryState.DELIVERED, AttemptOutcome.DELIVERED
    elif result.permanent:
        state, outcome = DeliveryState.FAILED, AttemptOutcome.PERMANENT_FAILURE
    elif event.delivery_attempts >= settings.NOTIFYQUEUE_WEBHOOK_MAX_ATTEMPTS:
        state, outcome = DeliveryState.FAILED, AttemptOutcome.TEMPORARY_FAILURE
    else:
        state, outcome = DeliveryState.PENDING, AttemptOutcome.TEMPORARY_FAILURE
        retry_in_s = webhook_retry_wait_seconds(
            attempt=event.delivery_attempts,
            schedule=settings.NOTIFYQUEUE_WEBHOOK_RETRY_SCHEDULE,
        )
    return EventResult(
        event_id=event.id,
        claim_token=event.claim_token,
        state=state,
        outcome=outcome,
        retry_in_s=retry_in_s,
        status_code=result.status_code,
        error=result.error,
        duration_ms=round(result.duration_s * 1000),
    )


def _results(
    posted: list[tuple[ClaimedEvent, PostResult]],
) -> list[tuple[ClaimedEvent, EventResult]]:
    return [(event, _result(event, result)) for event, result in posted]


def _counted(
    results: list[tuple[ClaimedEvent, EventResult]], finished: set[uuid.UUID]
) -> WebhookBatch:
    """Counts recorded results by the events' new states; a result whose claim was taken over
    meanwhile was dropped (`stale`)."""
    counts = {DeliveryState.DELIVERED: 0, DeliveryState.PENDING: 0, DeliveryState.FAILED: 0}
    stale = 0
    for event, ended in results:
        if event.id not in finished:
            logger.warning(
                "webhook event %s: claim %s was taken over before its result (%s) was recorded",
                event.id,
                event.claim_token,
                ended.outcome,
            )
            stale += 1
            continue
        counts[ended.state] += 1
        metrics.webhook_attempt_recorded(outcome=ended.outcome, state=ended.state)
        if ended.state != DeliveryState.DELIVERED:
            logger.info(
                "webhook event %s attempt %s: %s -> %s",
                event.id,
                event.attempt_number,
                ended.error,
                ended.state,
            )
    return WebhookBatch(
        delivered=counts[DeliveryState.DELIVERED],
        retrying=counts[DeliveryState.PENDING],
        failed=counts[DeliveryState.FAILED],
        stale=stale,
    )


def webhook_claim_ahead_rounds(*, claim_timeout_s: float, timeout_s: float) -> int:
    """How many rounds of a client's POST slots a sender claims at once: as many as fit, one
    POST timeout each, in the claim timeout less one POST timeout (so a claim waiting behind a
    hanging endpoint is POSTed and recorded before it expires), at most
    CLAIM_AHEAD_ROUNDS_MAX."""
    return max(1, min(CLAIM_AHEAD_ROUNDS_MAX, math.floor(claim_timeout_s / timeout_s) - 1))


@dataclass
class _Lane:
    """One client's claims in this sender: those waiting for one of its POST slots, and how
    many of its POSTs are open (at most NOTIFYQUEUE_WEBHOOK_CLIENT_CONCURRENCY)."""

    waiting: deque[ClaimedEvent] = field(default_factory=deque)
    posting: int = 0


class WebhookDeliveries:
    """A sender's claims, POSTed on a thread pool, each client's through its own lane; results
    recorded on the thread that calls `step`, with that thread's database connection.

    The database work and the POSTs overlap: a sender claims `ahead` rounds of each client's
    POST slots at once, and a POST that ends starts the next waiting event of its client on
    the same pool thread's turn, without waiting for the loop. A step records every POST that
    ended and claims for the room that freed, in one transaction (one commit).

    Fairness: a client has at most NOTIFYQUEUE_WEBHOOK_CLIENT_CONCURRENCY POSTs open at once
    (its lane starts no more) and at most that times `ahead` claims, all in one sender (the
    claim gives none to a client whose events another sender holds); the claim takes every
    client's oldest due event before any client's second; the pool runs the clients' POSTs in
    the order they were started, one POST per turn. A receiver that hangs therefore holds at
    most its client's POST slots, for at most NOTIFYQUEUE_WEBHOOK_TIMEOUT_SECONDS each, while
    the other slots keep turning over; its waiting claims are POSTed within half the claim
    timeout (`webhook_claim_ahead_rounds`).
    """

    def __init__(
        self,
        *,
        concurrency: int | None = None,
        worker: str | None = None,
        ahead: int | None = None,
    ) -> None:
        self.concurrency = concurrency or settings.NOTIFYQUEUE_WEBHOOK_CONCURRENCY
        self.per_client = settings.NOTIFYQUEUE_WEBHOOK_CLIENT_CONCURRENCY
        self.ahead = ahead or webhook_claim_ahead_rounds(
            claim_timeout_s=settings.NOTIFYQUEUE_WEBHOOK_CLAIM_TIMEOUT_SECONDS,
            timeout_s=settings.NOTIFYQUEUE_WEBHOOK_TIMEOUT_SECONDS,
        )
        # The worker whose heartbeat vouches for this sender's claims (None: none does, and
        # only their claim timeout hands them over).
        self.worker = worker
        self._pool = ThreadPoolExecutor(
            max_workers=self.concurrency, thread_name_prefix="webhook-post"
        )
        self._changed = threading.Condition()
        self._lanes: dict[uuid.UUID, _Lane] = {}
        self._ended: list[tuple[ClaimedEvent, PostResult]] = []
        # Claims whose result is not recorded yet: waiting, posting or ended.
        self._held = 0
        self._next_claim = 0.0
        # Cleared by `stop_starting`: the POSTs open end, no waiting one starts.
        self._starting = True
        # POST slots submitted to the pool and not yet running (waiting for a thread).
        self._queued = 0

    @property
    def in_flight(self) -> int:
        return self._held

    def step(self, *, limit: int | None = None, wait_s: float = 0.0) -> WebhookBatch:
        """Records the POSTs that ended (waiting up to `wait_s` for one when none has), then
        claims up to `limit` due events for the room that is free, and starts their POSTs;
        the results and the claim in one transaction."""
        with self._changed:
            if self._held and not self._ended and wait_s > 0:
                self._changed.wait(wait_s)
            ended, self._ended = self._ended, []
        room = self.concurrency * self.ahead - self._held + len(ended)
        limit = min(limit or settings.NOTIFYQUEUE_WEBHOOK_BATCH_SIZE * self.ahead, room)
        if not self._claim_due(freed=len(ended)):
            limit = 0
        results = _results(ended)
        try:
            finished, events = repositories.webhook_events_step(
                [r for _, r in results],
                limit=limit,
                per_client=self.per_client * self.ahead,
                claim_timeout_s=settings.NOTIFYQUEUE_WEBHOOK_CLAIM_TIMEOUT_SECONDS,
                worker=self.worker,
            )
        except BaseException:
            # Kept for the next step: each keeps its slot until its result is written, instead
            # of each claim waiting for its expiry and the receiver for a second POST.
            with self._changed:
                self._ended[:0] = ended
            raise
        if limit:
            self._next_claim = time.monotonic() + CLAIM_INTERVAL_S
        with self._changed:
            self._held += len(events) - len(ended)
            self._start(events)
        return replace(_counted(results, finished), claimed=len(events))

    def _claim_due(self, *, freed: int) -> bool:
        """Whether this step claims: when some client's lane runs short of waiting events (or
        there is none), when results freed room, or at least every CLAIM_INTERVAL_S, so a
        client with no lane yet waits no longer than that for its first claim."""
        if freed or not self._lanes or time.monotonic() >= self._next_claim:
            return True
        return any(len(lane.waiting) < self.per_client for lane in self._lanes.values())

    def _start(self, events: list[ClaimedEvent]) -> None:
        """Queues the claimed events in their clients' lanes and opens the free POST slots
        (called holding `_changed`)."""
        for event in events:
            lane = self._lanes.setdefault(event.client_id, _Lane())
            lane.waiting.append(event)
        for client_id, lane in self._lanes.items():
            while self._starting and lane.posting < self.per_client and lane.waiting:
                lane.posting += 1
                self._queued += 1
                self._pool.submit(self._posts, client_id, lane.waiting.popleft())

    def _posts(self, client_id: uuid.UUID, event: ClaimedEvent) -> None:
        """A POST slot of the client's, on a pool thread: POSTs `event`, then the lane's next
        waiting events one after another while no other POST waits for a thread; when one
        does, the next event goes to the back of the pool's queue (first in, first out), so
        clients take turns when there are more POSTs than threads."""
        with self._changed:
            self._queued -= 1
        while event is not None:
            try:
                result = _post(event)
            except Exception as exc:
                # A bug while building the request must not strand the claim until it expires.
                logger.exception("webhook event %s: POST raised", event.id)
                result = PostResult(False, False, None, f"{type(exc).__name__}", 0.0)
            with self._changed:
                self._ended.append((event, result))
                self._changed.notify_all()
                lane = self._lanes[client_id]
                event = None
                if lane.waiting and self._starting:
                    event = lane.waiting.popleft()
                    if self._queued:
                        self._queued += 1
                        self._pool.submit(self._posts, client_id, event)
                        return
                else:
                    lane.posting -= 1
                    if not lane.posting and not lane.waiting:
                        del self._lanes[client_id]

    def stop_starting(self) -> None:
        """From any thread: no POST starts from now on (`close` gives the waiting claims
        back); those open run to their end."""
        with self._changed:
            self._starting = False
            self._changed.notify_all()

    def finish(self) -> WebhookBatch:
        """Waits for every claim held to be POSTed and records the results; claims nothing."""
        with self._changed:
            while len(self._ended) < self._held:
                self._changed.wait()
        return self._record_ended()

    def close(self) -> None:
        """Gives back the claims still waiting for a POST slot (unsent, their attempt not
        counted), waits for the POSTs open and records them."""
        self.stop_starting()
        with self._changed:
            unstarted = [event for lane in self._lanes.values() for event in lane.waiting]
            for lane in self._lanes.values():
                lane.waiting.clear()
            # No longer this sender's to record: released below, or (if that fails) taken
            # back by the reaper once the worker is dead or the claims expire.
            self._held -= len(unstarted)
        try:
            if unstarted:
                released = repositories.webhook_events_release(unstarted)
                logger.info(
                    "webhook sender stopping: %d claims given back unsent (%d taken over "
                    "meanwhile)",
                    len(released),
                    len(unstarted) - len(released),
                )
        finally:
            self.finish()
            self._pool.shutdown()

    def _record_ended(self) -> WebhookBatch:
        with self._changed:
            ended, self._ended = self._ended, []
        results = _results(ended)
        try:
            finished = repositories.webhook_events_finish([r for _, r in results])
        except BaseException:
            with self._changed:
                self._ended[:0] = ended
            raise
        with self._changed:
            self._held -= len(ended)
        return _counted(results, finished)


def webhook_events_deliver_due(*, limit: int | None = None) -> WebhookBatch:
    """One batch from start to end: claims up to `limit` due events (at most
    NOTIFYQUEUE_WEBHOOK_CONCURRENCY), POSTs them, records each result.

    Takes at most about the webhook timeout: every POST of the batch runs at once and each is
    cut off at the timeout. (`run_worker` keeps a WebhookDeliveries open instead, so slots
    are refilled as they free up.)
    """
    deliveries = WebhookDeliveries(ahead=1)
    try:
        started = deliveries.step(limit=limit)
        finished = deliveries.finish()
    finally:
        deliveries.close()
    return replace(finished, claimed=started.claimed)


def webhook_events_reclaim_expired(*, limit: int = RECLAIM_BATCH) -> list[ReclaimedEvent]:
    """The reaper's step: returns to the queue the events whose worker is dead (no heartbeat
    for NOTIFYQUEUE_WORKER_DEAD_AFTER_SECONDS, by the database's clock) and those whose claim
    expired (NOTIFYQUEUE_WEBHOOK_CLAIM_TIMEOUT_SECONDS) whoever holds them.

    Returns the events it released, each with its new state (PENDING, or FAILED when the
    abandoned claim was the event's last attempt) and the cause; counts them by cause.
    """
    reclaimed = repositories.webhook_events_reclaim_expired(
        limit=limit,
        max_attempts=settings.NOTIFYQUEUE_WEBHOOK_MAX_ATTEMPTS,
        dead_after_s=settings.NOTIFYQUEUE_WORKER_DEAD_AFTER_SECONDS,
    )
    for event in reclaimed:
        logger.warning(
            "webhook event %s: claim taken back cause=%s, now %s",
            event.id,
            event.cause,
            event.state,
        )
        metrics.claim_rescued(kind="webhook_event", cause=event.cause)
    return reclaimed


def webhook_events_redeliver(*, event_ids: list[uuid.UUID]) -> list[uuid.UUID]:
    """An operator's redelivery of DELIVERED or FAILED events, with a fresh set of attempts.

    Returns the ids that were queued; events still PENDING or DELIVERING are left as they are.
    The receiver sees the same eventId again.
    """
    return repositories.webhook_events_redeliver(event_ids=event_ids)


def client_webhook_secret_rotate(*, client_id: uuid.UUID) -> bool:
    """Gives the client a new secret; the old one keeps signing alongside it for 24 hours.

    During the overlap every webhook carries two signatures, so a receiver verifies with
    either secret and can switch when it likes. A second rotation within the overlap retires
    the oldest secret at once.
    """
    return repositories.client_webhook_secret_replace(
        client_id=client_id,
        new_secret=webhook_secret_new(),
        overlap=PREVIOUS_SECRET_OVERLAP,
    )
