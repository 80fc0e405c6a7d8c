"""What /status answers: healthy or degraded, and why. No queries here.

Invariants protected here:
- degraded (503) exactly when the database cannot be reached, migrations are pending, or no
  worker is alive while PENDING work has been due for longer than the overdue threshold; a
  quiet queue with no worker is healthy (there is nothing to be late);
- a failure of the database at any point of the check is a reason, never an exception.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from django.conf import settings

from health.repositories import CircuitReading, DatabaseUnavailable, Liveness, QueueSnapshot
from monitoring.services import worker_live_window_s

QUEUE_STATUSES = ("PENDING", "PROCESSING", "FAILED", "DEAD_LETTERED")


class HealthSource(Protocol):
    def ping(self) -> None: ...

    def migrations_pending(self) -> list[str]: ...

    def liveness(self, *, now: datetime, worker_dead_after_s: float) -> Liveness: ...

    def queue_snapshot(self, *, now: datetime, worker_dead_after_s: float) -> QueueSnapshot: ...

    def circuits(self) -> list[CircuitReading]: ...


@dataclass(frozen=True)
class StatusThresholds:
    worker_live_window_s: float
    max_overdue_s: float


@dataclass(frozen=True)
class StatusReport:
    healthy: bool
    body: dict[str, Any]


def status_thresholds_from_settings() -> StatusThresholds:
    return StatusThresholds(
        worker_live_window_s=worker_live_window_s(),
        max_overdue_s=settings.NOTIFYQUEUE_STATUS_MAX_OVERDUE_SECONDS,
    )


def status_report(
    *, source: HealthSource, now: datetime, thresholds: StatusThresholds, details: bool = True
) -> StatusReport:
    """Checks the database, the migrations, the workers and the queue, in that order. Without
    `details` (an anonymous /status, which answers only healthy or not) the queue is not
    counted: the answer is decided from the bounded reads of `liveness` alone."""
    reasons: list[str] = []
    body: dict[str, Any] = {"checked_at": _iso(now)}
    try:
        source.ping()
    except DatabaseUnavailable as exc:
        reasons.append(f"database unreachable: {exc}")
        body["database"] = {"reachable": False, "error": str(exc)}
        return _report(reasons, body)
    body["database"] = {"reachable": True}
    try:
        pending = source.migrations_pending()
        body["migrations"] = {"applied": not pending, "pending": pending}
        if pending:
            reasons.append(f"{len(pending)} migration(s) not applied: {', '.join(pending)}")
        dead_after_s = thresholds.worker_live_window_s
        if not details:
            reasons += _liveness_reasons(
                source.liveness(now=now, worker_dead_after_s=dead_after_s), thresholds
            )
            return _report(reasons, body)
        snapshot = source.queue_snapshot(now=now, worker_dead_after_s=dead_after_s)
        circuits = source.circuits()
    except DatabaseUnavailable as exc:
        reasons.append(f"database error during the check: {exc}")
        return _report(reasons, body)
    body["workers"] = {
        "live": snapshot.workers_live,
        "last_seen_at": _iso(snapshot.worker_last_seen_at),
        "live_window_seconds": thresholds.worker_live_window_s,
    }
    body["queue"] = {
        "depth": {status: snapshot.depth_of(status) for status in QUEUE_STATUSES},
        "estimated_final": snapshot.final_estimates,
        "oldest_overdue_seconds": round(snapshot.oldest_overdue_s, 3),
        "dead_lettered": snapshot.dead_lettered,
    }
    body["webhooks"] = {
        "pending": snapshot.webhook_backlog.get("PENDING", 0),
        "delivering": snapshot.webhook_backlog.get("DELIVERING", 0),
        "oldest_overdue_seconds": round(snapshot.webhook_oldest_overdue_s, 3),
    }
    # An open circuit is reported, not a reason to be degraded: the breaker is doing its job
    # and fallback channels take over. Alert on it from /metrics instead.
    body["circuits"] = {
        "total": len(circuits),
        "open": [
            {
                "name": c.name,
                "state": c.state,
                "consecutive_failures": c.consecutive_failures,
                "opened_at": _iso(c.opened_at),
            }
            for c in circuits
            if c.state != "CLOSED"
        ],
    }
    return _report(reasons + _liveness_reasons(snapshot, thresholds), body)


def _liveness_reasons(live: Liveness, thresholds: StatusThresholds) -> list[str]:
    if live.workers_live == 0 and live.oldest_overdue_s > thresholds.max_overdue_s:
        return [
            f"no live worker (none seen in the last {thresholds.worker_live_window_s:g}s) "
            f"while PENDING work is overdue by {live.oldest_overdue_s:.0f}s"
        ]
    return []


def _report(reasons: list[str], body: dict[str, Any]) -> StatusReport:
    healthy = not reasons
    return StatusReport(
        healthy=healthy,
        body={"status": "ok" if healthy else "degraded", "reasons": reasons, **body},
    )


def _iso(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")
