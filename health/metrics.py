"""The gauges about the whole queue, read from PostgreSQL at scrape time by `QueueCollector`.
Only the API's `/metrics` serves them (`QUEUE_REGISTRY` in health/views.py, not the default
registry), so running ten workers does not mean ten copies of the same database numbers."""

from __future__ import annotations

from django.utils import timezone
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from health.repositories import DatabaseUnavailable, HealthRepository
from monitoring.services import worker_live_window_s

CIRCUIT_STATE_VALUES = {"CLOSED": 0, "HALF_OPEN": 1, "OPEN": 2}


class QueueCollector:
    """Queue gauges computed at scrape time with the cheap queries of `HealthRepository`."""

    def __init__(self, repository_factory) -> None:
        self._repository_factory = repository_factory

    def collect(self):
        now = timezone.now()
        try:
            repository = self._repository_factory()
            snapshot = repository.queue_snapshot(
                now=now, worker_dead_after_s=worker_live_window_s()
            )
            circuits = repository.circuits()
        except DatabaseUnavailable:
            yield GaugeMetricFamily(
                "notifyqueue_database_up", "1 when PostgreSQL answered this scrape.", value=0
            )
            return
        yield GaugeMetricFamily(
            "notifyqueue_database_up", "1 when PostgreSQL answered this scrape.", value=1
        )
        depth = GaugeMetricFamily(
            "notifyqueue_queue_depth",
            "Notifications waiting or held by an operator, by status and priority (exact).",
            labels=["status", "priority"],
        )
        for (status, priority), count in sorted(snapshot.depth.items()):
            depth.add_metric([status, priority], count)
        yield depth
        estimated = GaugeMetricFamily(
            "notifyqueue_notifications_estimated",
            "Rows in the final statuses SENT, CANCELLED, SUPPRESSED, EXPIRED and DIGESTED, "
            "estimated from "
            "planner statistics (no count is run).",
            labels=["status"],
        )
        for status, count in sorted(snapshot.final_estimates.items()):
            estimated.add_metric([status], count)
        yield estimated
        held = GaugeMetricFamily(
            "notifyqueue_notifications_held",
            "PENDING notifications held past their own time, by held_reason: rate_limit (the "
            "recipient's rate limit), circuit_open (the provider's open circuit), quiet_hours "
            "(the user's quiet hours). Exact, from each reason's partial index.",
            labels=["reason"],
        )
        for reason, count in sorted(snapshot.held.items()):
            held.add_metric([reason], count)
        yield held
        yield GaugeMetricFamily(
            "notifyqueue_queue_oldest_overdue_seconds",
            "How long the longest-due PENDING notification has been due (0 when none is).",
            value=snapshot.oldest_overdue_s,
        )
        yield GaugeMetricFamily(
            "notifyqueue_dead_letter_size",
            "Notifications in DEAD_LETTERED, waiting for an operator.",
            value=snapshot.dead_lettered,
        )
        backlog = GaugeMetricFamily(
            "notifyqueue_webhook_backlog",
            "Webhook events not yet delivered or given up, by state.",
            labels=["state"],
        )
        for state, count in sorted(snapshot.webhook_backlog.items()):
            backlog.add_metric([state], count)
        yield backlog
        yield GaugeMetricFamily(
            "notifyqueue_webhook_oldest_overdue_seconds",
            "How long the longest-due PENDING webhook event has been due (0 when none is).",
            value=snapshot.webhook_oldest_overdue_s,
        )
        yield GaugeMetricFamily(
            "notifyqueue_workers_live",
            "Workers whose heartbeat is recent and that have not stopped.",
            value=snapshot.workers_live,
        )
        state = GaugeMetricFamily(
            "notifyqueue_circuit_state",
            "Each provider's circuit breaker: 0 CLOSED, 1 HALF_OPEN (one probe let through), "
            "2 OPEN (failing fast).",
            labels=["circuit"],
        )
        failures = GaugeMetricFamily(
            "notifyqueue_circuit_consecutive_failures",
            "Consecutive temporary failures counted by each provider's circuit breaker.",
            labels=["circuit"],
        )
        for circuit in circuits:
            state.add_metric([circuit.name], CIRCUIT_STATE_VALUES[circuit.state])
            failures.add_metric([circuit.name], circuit.consecutive_failures)
        yield state
        yield failures


def queue_registry_build() -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(HealthRepository))
    return registry
