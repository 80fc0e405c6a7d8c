"""The only code that queries PostgreSQL for /status and the queue gauges of /metrics.

Invariants protected here:
- every query is cheap on a table of millions of rows: it reads a partial index that holds
  only waiting or operator-held rows, or planner statistics, never the finished rows
  (`sql/health.sql` says which index serves each one);
- the counts of the waiting and held rows, whose cost grows with the backlog, are read at a
  bounded pace (`PacedCounts`): at most about 1 % of a process's time, however often they
  are asked for;
- a database that cannot be reached is reported as `DatabaseUnavailable`, never as an
  exception from the driver.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from django.db import DatabaseError, connection
from django.db.migrations.executor import MigrationExecutor

from notifyqueue.sqlgateway import Queries
from notifyqueue.vocabulary import Priority

SQL = Queries(Path(__file__).with_name("sql") / "health.sql")


log = logging.getLogger("notifyqueue.monitoring")

# A count of the queue or the webhook backlog reads an index entry per counted row, so its
# cost grows with the backlog. One that took COUNT_FREE_S or longer is answered again, unread,
# until COUNT_REUSE_FACTOR times as long has passed: counting then takes at most about 1 % of a
# process's time however often /status and /metrics are asked (the queue's count with 832,604
# PENDING rows took ~100 ms: reused for ~10 s). A cheaper count is read afresh every time.
# Never reused longer than COUNT_REUSE_MAX_S: a count slowed by a passing stall (a lock, a
# checkpoint) must not leave the gauges stale for a hundred times the stall.
COUNT_FREE_S = 0.01
COUNT_REUSE_FACTOR = 100
COUNT_REUSE_MAX_S = 60.0


class PacedCounts:
    """Counts by name, each reused for COUNT_REUSE_FACTOR times what it took to read (at most
    COUNT_REUSE_MAX_S) when that was COUNT_FREE_S or more. Thread-safe; one per process
    (`COUNTS`), or one per test."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._kept: dict[tuple[str, str], tuple[Any, float]] = {}

    def read(self, key: tuple[str, str], count: Callable[[], Any]) -> Any:
        """`count()`, or what it gave last time while that is still to be reused."""
        started = self._clock()
        with self._lock:
            kept = self._kept.get(key)
        if kept is not None and started < kept[1]:
            return kept[0]
        value = count()
        took = self._clock() - started
        with self._lock:
            if took >= COUNT_FREE_S:
                reuse_s = min(took * COUNT_REUSE_FACTOR, COUNT_REUSE_MAX_S)
                self._kept[key] = (value, started + reuse_s)
            else:
                self._kept.pop(key, None)
        return value


COUNTS = PacedCounts()


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
class Liveness:
    """What decides whether the service is healthy: whether work is overdue with no worker."""

    oldest_overdue_s: float = 0.0
    workers_live: int = 0
    worker_last_seen_at: datetime | None = None


@dataclass(frozen=True)
class QueueSnapshot(Liveness):
    """The operator's view: the liveness reads, and the queue's and webhooks' counts."""

    # (status, priority name) -> rows, for PENDING, PROCESSING, FAILED and DEAD_LETTERED.
    depth: dict[tuple[str, str], int] = field(default_factory=dict)
    # SENT, CANCELLED, SUPPRESSED, EXPIRED, DIGESTED -> estimated rows (planner statistics).
    final_estimates: dict[str, int] = field(default_factory=dict)
    webhook_backlog: dict[str, int] = field(default_factory=dict)
    webhook_oldest_overdue_s: float = 0.0
    # held_reason -> PENDING rows held past their own time for it (rate_limit, circuit_open,
    # quiet_hours).
    held: dict[str, int] = field(default_factory=dict)

    @property
    def dead_lettered(self) -> int:
        return self.depth_of("DEAD_LETTERED")

    def depth_of(self, status: str) -> int:
        return sum(count for (s, _), count in self.depth.items() if s == status)


@dataclass(frozen=True)
class _StatusCount:
    status: str
    count: int


@dataclass(frozen=True)
class _StateCount:
    state: str
    count: int


@dataclass(frozen=True)
class _HeldCount:
    reason: str
    count: int


@dataclass(frozen=True)
class _DepthCount:
    status: str
    priority: int
    count: int


@dataclass(frozen=True)
class _WorkersLive:
    live: int
    last_seen_at: datetime | None


class HealthRepository:
    # Once every migration is applied it stays so for the life of the process (a deploy that
    # adds migrations restarts it), so the migration graph is loaded at most until then.
    _migrations_applied = False

    def __init__(self, using=None, counts: PacedCounts | None = None) -> None:
        self.connection = using or connection
        self.counts = counts or COUNTS

    def ping(self) -> None:
        with self._reachable():
            SQL.scalar("database_ping", using=self.connection)

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

    def liveness(self, *, now: datetime, worker_dead_after_s: float) -> Liveness:
        """Two bounded reads: the longest-due PENDING row (a probe per priority) and the live
        workers (a small table): those not dead by `worker_dead`, the definition by which
        their claims are taken over (no heartbeat for `worker_dead_after_s` by the database's
        clock, or stopped). Not the queue's counts: an anonymous /status is answered from
        this alone."""
        using = self.connection
        with self._reachable():
            oldest_due = SQL.scalar("pending_oldest_due", using=using, now=now)
            workers = SQL.row(
                "workers_live",
                row=_WorkersLive,
                using=using,
                dead_after_s=worker_dead_after_s,
            )
        return Liveness(
            oldest_overdue_s=_seconds_since(oldest_due, now),
            workers_live=workers.live,
            worker_last_seen_at=workers.last_seen_at,
        )

    def queue_snapshot(self, *, now: datetime, worker_dead_after_s: float) -> QueueSnapshot:
        using = self.connection
        live = self.liveness(now=now, worker_dead_after_s=worker_dead_after_s)
        alias = using.alias
        with self._reachable():
            depth = self.counts.read(
                (alias, "queue_depth"),
                lambda: SQL.rows("queue_depth", row=_DepthCount, using=using),
            )
            estimates = SQL.rows("final_status_estimates", row=_StatusCount, using=using)
            backlog = self.counts.read(
                (alias, "webhook_backlog"),
                lambda: SQL.rows("webhook_backlog", row=_StateCount, using=using),
            )
            webhook_due = SQL.scalar("webhook_oldest_due", using=using, now=now)
            held = self.counts.read(
                (alias, "held_by_reason"),
                lambda: SQL.rows("held_by_reason", row=_HeldCount, using=using),
            )
        return QueueSnapshot(
            **vars(live),
            depth={(d.status, Priority(d.priority).name): d.count for d in depth},
            final_estimates={e.status: e.count for e in estimates},
            webhook_backlog={b.state: b.count for b in backlog},
            webhook_oldest_overdue_s=_seconds_since(webhook_due, now),
            held={h.reason: h.count for h in held},
        )

    def circuits(self) -> list[CircuitReading]:
        """Every provider's circuit breaker and its state."""
        with self._reachable():
            return SQL.rows("circuits_all", row=CircuitReading, using=self.connection)

    @contextmanager
    def _reachable(self) -> Iterator[None]:
        try:
            yield
        except DatabaseError as exc:
            raise _unavailable(exc) from exc


def _seconds_since(moment: datetime | None, now: datetime) -> float:
    return 0.0 if moment is None else max(0.0, (now - moment).total_seconds())
