"""Every Prometheus metric Notify Queue defines (docs/operations.md describes each one).

Two kinds:
- counters and histograms that a process increments as things happen (notifications created
  by the API, attempts and finishes recorded by a worker, webhook POSTs); each process exposes
  its own, the API on `/metrics`, a worker on `--metrics-port`;
- gauges about the whole queue, read from PostgreSQL at scrape time: those are the health
  app's (`health/metrics.py`), which reads every app's tables; only the API's `/metrics`
  serves them, so running ten workers does not mean ten copies of the same database numbers.

The helpers below are what the rest of the code calls, so no caller builds label sets itself.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from prometheus_client import Counter, Histogram

from notifyqueue.vocabulary import Channel

FINAL_STATUSES = ("SENT", "FAILED", "DEAD_LETTERED", "SUPPRESSED", "EXPIRED", "DIGESTED")

NOTIFICATIONS_CREATED = Counter(
    "notifyqueue_notifications_created",
    "Notifications accepted by the API (201s, not replays).",
    ["channel"],
)
NOTIFICATIONS_FINISHED = Counter(
    "notifyqueue_notifications_finished",
    "Notifications a worker moved to a final status.",
    ["channel", "status"],
)
NOTIFICATIONS_CANCELLED = Counter(
    "notifyqueue_notifications_cancelled",
    "Notifications the API cancelled, one by id or a group by cancellation key.",
    ["how"],
)
DIGEST_EVENTS_COLLECTED = Counter(
    "notifyqueue_digest_events_collected",
    "Notifications a create collected into an open digest bucket instead of queueing them.",
    ["channel"],
)
DIGESTS_CLOSED = Counter(
    "notifyqueue_digests_closed",
    "Digest buckets a worker closed: `outcome` sent (a digest created) or empty (every "
    "collected notification was cancelled or expired first).",
    ["channel", "outcome"],
)
NOTIFICATIONS_RETRIED = Counter(
    "notifyqueue_notifications_retried",
    "Notifications an operator sent back to PENDING (API, admin or command).",
    ["channel"],
)
DELIVERY_ATTEMPT_DURATION = Histogram(
    "notifyqueue_delivery_attempt_duration_seconds",
    "Time from the start of a delivery attempt to the provider's answer.",
    ["channel", "outcome"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
RATE_LIMIT_DEFERRALS = Counter(
    "notifyqueue_rate_limit_deferrals",
    "Claims given back because the recipient was at its rate limit (no attempt used).",
    ["channel"],
)
QUIET_HOURS_HOLDS = Counter(
    "notifyqueue_quiet_hours_holds",
    "Claims given back because their user's quiet hours held them (no attempt used).",
    ["channel"],
)
SUPPRESSED_SENDS = Counter(
    "notifyqueue_suppressed_sends",
    "Claims the suppression list stopped at send time (never sent), by suppression reason.",
    ["channel", "reason"],
)
RECEIPTS = Counter(
    "notifyqueue_receipts",
    "Provider delivery receipts recorded (each message's receipt of a type once), by type.",
    ["channel", "type"],
)
WEBHOOK_DELIVERIES = Counter(
    "notifyqueue_webhook_deliveries",
    "Webhook POSTs recorded, by attempt outcome and the event's resulting state.",
    ["outcome", "state"],
)

CLAIMS_RESCUED = Counter(
    "notifyqueue_claims_rescued",
    "Claims this process took back from another holder, by what was claimed (notification, "
    "webhook_event) and why: dead_worker (no heartbeat for NOTIFYQUEUE_WORKER_DEAD_AFTER_SECONDS) "
    "or claim_timeout (past its claim timeout, whoever held it).",
    ["kind", "cause"],
)


class LabelledChildren:
    """Each labelled child of a metric, looked up once: prometheus_client checks and orders the
    label names, builds the key and takes a lock on every `labels()` call. At most `kept` are
    kept; past that a child is looked up each time (labels a caller invents cannot grow the
    cache)."""

    def __init__(self, *, kept: int) -> None:
        self._kept = kept
        self._children: dict[tuple, Any] = {}

    def __len__(self) -> int:
        return len(self._children)

    def get(self, metric: Any, **labels: Any) -> Any:
        key = (id(metric), *labels.items())
        child = self._children.get(key)
        if child is None:
            child = metric.labels(**labels)
            if len(self._children) < self._kept:
                self._children[key] = child
        return child


# NOTIFICATIONS_CREATED's children, one a channel (channels are validated before a create).
_CREATED = LabelledChildren(kept=len(Channel))


def notification_created(*, channel: str, count: int = 1) -> None:
    _CREATED.get(NOTIFICATIONS_CREATED, channel=channel).inc(count)


def notifications_cancelled(*, count: int, how: str = "key") -> None:
    """`how`: "id" (POST /notifications/{id}/cancel) or "key" (by cancellation key)."""
    NOTIFICATIONS_CANCELLED.labels(how=how).inc(count)


def notifications_expired(*, channel: str, count: int = 1) -> None:
    """Waiting notifications the worker's upkeep ended EXPIRED (the claims its expiry stage
    ends are counted with the other finishes)."""
    NOTIFICATIONS_FINISHED.labels(channel=channel, status="EXPIRED").inc(count)


def digest_events_collected(*, channel: str, count: int = 1) -> None:
    DIGEST_EVENTS_COLLECTED.labels(channel=channel).inc(count)


def digest_closed(*, channel: str, digested: int) -> None:
    """A bucket closed: its rows ended DIGESTED (counted as finishes) and its digest, if any."""
    DIGESTS_CLOSED.labels(channel=channel, outcome="sent" if digested else "empty").inc()
    if digested:
        NOTIFICATIONS_FINISHED.labels(channel=channel, status="DIGESTED").inc(digested)


def notification_retried(*, channel: str) -> None:
    NOTIFICATIONS_RETRIED.labels(channel=channel).inc()


def receipt_recorded(*, channel: str, type: str) -> None:
    RECEIPTS.labels(channel=channel, type=type).inc()


def webhook_attempt_recorded(*, outcome: str, state: str) -> None:
    WEBHOOK_DELIVERIES.labels(outcome=outcome, state=state).inc()


def claim_rescued(*, kind: str, cause: str, count: int = 1) -> None:
    CLAIMS_RESCUED.labels(kind=kind, cause=cause).inc(count)


class _Claimed(Protocol):
    id: uuid.UUID
    claim_token: uuid.UUID
    channel: str


class _Finished(Protocol):
    id: uuid.UUID
    claim_token: uuid.UUID
    status: str
    outcome: str


class DeliveryMetrics:
    """What a worker reports about its deliveries.

    `attempt_finished` runs on the worker's loop when the provider has answered; it observes
    the duration and remembers the claim's channel. `results_recorded` runs once the finishing
    statement has said which results it applied: only those count as finished (a stale result
    from a worker whose claim was taken over changed nothing, so it counts nothing).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Each claim's channel by its claim token (unique to the claim).
        self._channels: dict[uuid.UUID, str] = {}
        # Each labelled series once: `labels()` checks and orders the names on every call,
        # which per delivered row was a tenth of a worker's own CPU. Channels, outcomes and
        # statuses are closed sets, so these stay small.
        self._durations: dict[tuple[str, str], Any] = {}
        self._finished: dict[tuple[str, str], Any] = {}

    def attempt_finished(self, claim: _Claimed, finish: _Finished, *, duration_s: float) -> None:
        labels = (claim.channel, finish.outcome)
        duration = self._durations.get(labels)
        if duration is None:
            duration = self._durations[labels] = DELIVERY_ATTEMPT_DURATION.labels(*labels)
        duration.observe(duration_s)
        with self._lock:
            self._channels[claim.claim_token] = claim.channel

    def results_recorded(
        self, finishes: Iterable[_Finished], applied: Mapping[uuid.UUID, str]
    ) -> None:
        counts: dict[tuple[str, str], int] = {}
        with self._lock:
            for finish in finishes:
                channel = self._channels.pop(finish.claim_token, None)
                final = finish.status in FINAL_STATUSES
                if channel is not None and finish.id in applied and final:
                    labels = (channel, finish.status)
                    counts[labels] = counts.get(labels, 0) + 1
        for labels, count in counts.items():
            finished = self._finished.get(labels)
            if finished is None:
                finished = self._finished[labels] = NOTIFICATIONS_FINISHED.labels(*labels)
            finished.inc(count)

    def rate_limit_deferred(self, *, channel: str) -> None:
        """A claim given back by the rate limit (it settles its own row, never a Finish)."""
        RATE_LIMIT_DEFERRALS.labels(channel=channel).inc()

    def quiet_hours_held(self, *, channel: str) -> None:
        """A claim given back by its user's quiet hours (settled by its own statement)."""
        QUIET_HOURS_HOLDS.labels(channel=channel).inc()

    def suppressed(self, *, channel: str, reason: str) -> None:
        """A claim the suppression list stopped before its send."""
        SUPPRESSED_SENDS.labels(channel=channel, reason=reason).inc()


DELIVERY = DeliveryMetrics()
