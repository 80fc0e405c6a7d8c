"""The /status decision with an in-memory health source: no database is touched here."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from health.repositories import CircuitReading, DatabaseUnavailable, Liveness, QueueSnapshot
from health.services import StatusThresholds, status_report

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
THRESHOLDS = StatusThresholds(worker_live_window_s=15, max_overdue_s=2)


@dataclass
class FakeHealth:
    snapshot: QueueSnapshot = field(default_factory=QueueSnapshot)
    pending_migrations: list[str] = field(default_factory=list)
    down: bool = False
    fails_after_ping: bool = False
    circuit_readings: list = field(default_factory=list)
    asked_dead_after_s: float | None = None
    snapshots_taken: int = 0

    def ping(self) -> None:
        if self.down:
            raise DatabaseUnavailable("connection refused")

    def migrations_pending(self) -> list[str]:
        if self.fails_after_ping:
            raise DatabaseUnavailable("server closed the connection unexpectedly")
        return self.pending_migrations

    def liveness(self, *, now, worker_dead_after_s) -> Liveness:
        self.asked_dead_after_s = worker_dead_after_s
        s = self.snapshot
        return Liveness(s.oldest_overdue_s, s.workers_live, s.worker_last_seen_at)

    def queue_snapshot(self, *, now, worker_dead_after_s) -> QueueSnapshot:
        self.asked_dead_after_s = worker_dead_after_s
        self.snapshots_taken += 1
        return self.snapshot

    def circuits(self):
        return self.circuit_readings


def report(source: FakeHealth):
    return status_report(source=source, now=NOW, thresholds=THRESHOLDS)


def test_a_quiet_queue_with_no_worker_is_healthy():
    result = report(FakeHealth())
    assert result.healthy
    assert result.body["status"] == "ok"
    assert result.body["reasons"] == []
    assert result.body["circuits"] == {"total": 0, "open": []}


def test_no_live_worker_while_work_is_overdue_is_degraded():
    result = report(FakeHealth(QueueSnapshot(oldest_overdue_s=30, workers_live=0)))
    assert not result.healthy
    assert result.body["status"] == "degraded"
    assert result.body["reasons"] == [
        "no live worker (none seen in the last 15s) while PENDING work is overdue by 30s"
    ]


def test_overdue_work_with_a_live_worker_is_not_a_reason():
    assert report(FakeHealth(QueueSnapshot(oldest_overdue_s=30, workers_live=1))).healthy


def test_work_overdue_by_less_than_the_threshold_is_not_a_reason():
    assert report(FakeHealth(QueueSnapshot(oldest_overdue_s=1.5, workers_live=0))).healthy


def test_workers_are_live_only_if_not_dead_by_the_takeovers_window():
    source = FakeHealth()
    report(source)
    assert source.asked_dead_after_s == 15


def test_an_unreachable_database_is_degraded_with_the_reason():
    result = report(FakeHealth(down=True))
    assert not result.healthy
    assert result.body["database"] == {"reachable": False, "error": "connection refused"}
    assert result.body["reasons"] == ["database unreachable: connection refused"]


def test_a_database_failing_in_the_middle_of_the_check_is_degraded_not_an_exception():
    result = report(FakeHealth(fails_after_ping=True))
    assert not result.healthy
    assert result.body["reasons"][0].startswith("database error during the check")


def test_pending_migrations_are_degraded_and_named():
    result = report(FakeHealth(pending_migrations=["notifications.0003_operator_retry"]))
    assert not result.healthy
    assert result.body["migrations"] == {
        "applied": False,
        "pending": ["notifications.0003_operator_retry"],
    }
    assert result.body["reasons"] == [
        "1 migration(s) not applied: notifications.0003_operator_retry"
    ]


def test_the_body_reports_depth_dead_letters_webhooks_and_open_circuits():
    snapshot = QueueSnapshot(
        depth={("PENDING", "HIGH"): 3, ("PENDING", "LOW"): 2, ("DEAD_LETTERED", "NORMAL"): 7},
        final_estimates={"SENT": 1_000_000},
        oldest_overdue_s=0.25,
        webhook_backlog={"PENDING": 4, "DELIVERING": 1},
        webhook_oldest_overdue_s=2.0,
        workers_live=2,
    )
    circuits = [
        CircuitReading("email:http", "OPEN", 5, NOW),
        CircuitReading("sms:simulated", "CLOSED", 0, None),
    ]
    result = report(FakeHealth(snapshot, circuit_readings=circuits))
    assert result.healthy  # an open circuit is reported, not a degradation
    body = result.body
    assert body["queue"] == {
        "depth": {"PENDING": 5, "PROCESSING": 0, "FAILED": 0, "DEAD_LETTERED": 7},
        "estimated_final": {"SENT": 1_000_000},
        "oldest_overdue_seconds": 0.25,
        "dead_lettered": 7,
    }
    assert body["webhooks"] == {"pending": 4, "delivering": 1, "oldest_overdue_seconds": 2.0}
    assert body["workers"]["live"] == 2
    assert body["circuits"] == {
        "total": 2,
        "open": [
            {
                "name": "email:http",
                "state": "OPEN",
                "consecutive_failures": 5,
                "opened_at": "2026-12-01T12:00:00Z",
            }
        ],
    }


def test_without_details_the_queue_is_not_counted_and_the_answer_is_the_same():
    for snapshot in (
        QueueSnapshot(),
        QueueSnapshot(oldest_overdue_s=30, workers_live=0),
        QueueSnapshot(oldest_overdue_s=30, workers_live=1),
    ):
        source = FakeHealth(snapshot)
        brief = status_report(source=source, now=NOW, thresholds=THRESHOLDS, details=False)
        assert source.snapshots_taken == 0
        full = report(FakeHealth(snapshot))
        assert (brief.healthy, brief.body["reasons"]) == (full.healthy, full.body["reasons"])
