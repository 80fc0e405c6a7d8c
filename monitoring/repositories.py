"""The only code that queries PostgreSQL for /status and the queue gauges of /metrics.

Invariants protected here:
- every query is cheap on a table of millions of rows: it reads a partial index that holds
  only waiting or operator-held rows, or planner statistics, never the finished rows
  (`sql/health.sql` says which index serves each one);
- a database that cannot be reached is reported as `DatabaseUnavailable`, never as an
  exception from the driver.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from django.db import DatabaseError, connection
from django.db.migrations.executor import MigrationExecutor

from notifyqueue.sqlfile import queries_load
from notifyqueue.vocabulary import Priority

SQL = queries_load(Path(__file__).with_name("sql") / "health.sql")


log = logging.getLogger("notifyqueue.monitoring")


class DatabaseUnavailable(Exception):
    """PostgreSQL could not be reached or answered with an error. Its text is the error's
    class only: the driver's message (hosts, users, database names) goes to the log."""


def _unavailable(exc: DatabaseError) -> DatabaseUnavailable:
    log.warning("health check database error error=%s", str(exc).strip().replace("\n", " "))
    return DatabaseUnavailable(type(exc).__name__)


@dataclass(frozen=True)
class CircuitReading:
    name: str
    state: str
    consecutive_failures: int
    opened_at: datetime | None


@dataclass(frozen=True)
class QueueSnapshot:
    # (status, priority name) -> rows, for PENDING, PROCESSING, FAILED and DEAD_LETTERED.
    depth: dict[tuple[str, str], int] = field(default_factory=dict)
    # SENT, CANCELLED, SUPPRESSED -> estimated rows (planner statistics).
    final_estimates: dict[str, int] = field(default_factory=dict)
    oldest_overdue_s: float = 0.0
    webhook_backlog: dict[str, int] = field(default_factory=dict)
    webhook_oldest_overdue_s: float = 0.0
    workers_live: int = 0
    worker_last_seen_at: datetime | None = None

    @property
    def dead_lettered(self) -> int:
        return self.depth_of("DEAD_LETTERED")

    def depth_of(self, status: str) -> int:
        return sum(count for (s, _), count in self.depth.items() if s == status)


class HealthRepository:
    # Once every migration is applied it stays so for the life of the process (a deploy that
    # adds migrations restarts it), so the migration graph is loaded at most until then.
    _migrations_applied = False

    def __init__(self, using=None) -> None:
        self.connection = using or connection

    def ping(self) -> None:
        self._fetch("database_ping")

    def migrations_pending(self) -> list[str]:
        """Migrations the code has and the database lacks, as `app.name`."""
        if HealthRepository._migrations_applied:
            return []
        try:
            executor = MigrationExecutor(self.connection)
            plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
        except DatabaseError as exc:
            raise _unavailable(exc) from exc
        pending = [f"{migration.app_label}.{migration.name}" for migration, _ in plan]
        if not pending:
            HealthRepository._migrations_applied = True
        return pending

    def queue_snapshot(self, *, now: datetime, workers_seen_since: datetime) -> QueueSnapshot:
        depth = {
            (status, Priority(priority).name): count
            for status, priority, count in self._fetch("queue_depth")
        }
        (oldest_due,) = self._fetch("pending_oldest_due", now=now)[0]
        (webhook_due,) = self._fetch("webhook_oldest_due", now=now)[0]
        workers, last_seen = self._fetch("workers_live", since=workers_seen_since)[0]
        return QueueSnapshot(
            depth=depth,
            final_estimates=dict(self._fetch("final_status_estimates")),
            oldest_overdue_s=_seconds_since(oldest_due, now),
            webhook_backlog=dict(self._fetch("webhook_backlog")),
            webhook_oldest_overdue_s=_seconds_since(webhook_due, now),
            workers_live=workers,
            worker_last_seen_at=last_seen,
        )

    def table_row_estimate(self, table: str) -> int | None:
        """The planner's estimate of a table's rows; None before its first ANALYZE."""
        rows = self._fetch("table_row_estimate", table=table)
        estimate = rows[0][0] if rows else None
        return None if estimate is None or estimate < 0 else estimate

    def circuits(self) -> list[CircuitReading]:
        """Every provider's circuit breaker and its state."""
        return [CircuitReading(*row) for row in self._fetch("circuits_all")]

    def _fetch(self, name: str, **params: Any) -> list[tuple]:
        try:
            with self.connection.cursor() as cursor:
                cursor.execute(SQL[name], params)
                return cursor.fetchall()
        except DatabaseError as exc:
            raise _unavailable(exc) from exc


def _seconds_since(moment: datetime | None, now: datetime) -> float:
    return 0.0 if moment is None else max(0.0, (now - moment).total_seconds())
