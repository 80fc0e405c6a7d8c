"""`manage.py queue_status` (or `notifyqueue queue_status`): /status for a terminal.

Depth per status and priority, how late the longest-due notification is, dead letters, live
workers, the webhook backlog and open circuits, read with the same cheap queries as /status
and the queue gauges of /metrics (health/repositories.py), once. Exit status 1 when
/status would answer 503, and the reasons.
"""

from __future__ import annotations

from datetime import datetime

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from health.repositories import (
    CircuitReading,
    DatabaseUnavailable,
    HealthRepository,
    QueueSnapshot,
)
from health.services import (
    QUEUE_STATUSES,
    StatusThresholds,
    status_report,
    status_thresholds_from_settings,
)
from notifyqueue.vocabulary import Priority

PRIORITIES = [priority.name for priority in sorted(Priority, key=lambda p: p.value)]


class _ReadOnce:
    """The health source of `status_report`, answering from one reading of the database."""

    def __init__(self, *, now: datetime, thresholds: StatusThresholds) -> None:
        repository = HealthRepository()
        repository.ping()
        self.pending_migrations = repository.migrations_pending()
        self.snapshot = repository.queue_snapshot(
            now=now, worker_dead_after_s=thresholds.worker_live_window_s
        )
        self.circuit_readings = repository.circuits()

    def ping(self) -> None:
        pass

    def migrations_pending(self) -> list[str]:
        return self.pending_migrations

    def queue_snapshot(self, *, now: datetime, worker_dead_after_s: float) -> QueueSnapshot:
        return self.snapshot

    def circuits(self) -> list[CircuitReading]:
        return self.circuit_readings


class Command(BaseCommand):
    help = "Prints the queue's depth by status and priority, lateness, dead letters and workers."

    def handle(self, *args, **options):
        now = timezone.now()
        thresholds = status_thresholds_from_settings()
        try:
            source = _ReadOnce(now=now, thresholds=thresholds)
        except DatabaseUnavailable as exc:
            raise CommandError(f"database unreachable: {exc}") from exc
        report = status_report(source=source, now=now, thresholds=thresholds)
        snapshot = source.snapshot
        write = self.stdout.write

        write(f"Notify Queue at {now:%Y-%m-%d %H:%M:%S} UTC: {report.body['status']}")
        write("")
        width = max(len(s) for s in QUEUE_STATUSES)
        write(f"{'status':<{width}}" + "".join(f"{p:>10}" for p in PRIORITIES) + f"{'total':>10}")
        for status in QUEUE_STATUSES:
            counts = [snapshot.depth.get((status, priority), 0) for priority in PRIORITIES]
            write(f"{status:<{width}}" + "".join(f"{c:>10}" for c in counts) + f"{sum(counts):>10}")
        write("")
        write(f"oldest due PENDING:  {snapshot.oldest_overdue_s:.1f} s overdue")
        write(f"dead letters:        {snapshot.dead_lettered}")
        last_seen = (
            f", last heartbeat {snapshot.worker_last_seen_at:%Y-%m-%d %H:%M:%S}"
            if snapshot.worker_last_seen_at
            else ""
        )
        write(f"workers live:        {snapshot.workers_live}{last_seen}")
        write(
            f"webhooks:            {snapshot.webhook_backlog.get('PENDING', 0)} pending, "
            f"{snapshot.webhook_backlog.get('DELIVERING', 0)} delivering, oldest "
            f"{snapshot.webhook_oldest_overdue_s:.1f} s overdue"
        )
        not_closed = [c for c in source.circuit_readings if c.state != "CLOSED"]
        write(
            f"circuits:            {len(source.circuit_readings)}, not closed: "
            + (
                ", ".join(
                    f"{c.name} {c.state} ({c.consecutive_failures} failures)" for c in not_closed
                )
                or "none"
            )
        )
        if source.pending_migrations:
            write(f"migrations pending:  {', '.join(source.pending_migrations)}")
        if not report.healthy:
            raise CommandError("degraded: " + "; ".join(report.body["reasons"]), returncode=1)
