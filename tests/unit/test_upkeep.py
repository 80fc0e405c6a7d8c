"""The worker's upkeep services (delivery/upkeep.py) over in-memory stand-ins: what each
`run_once()` does and returns. No database; their statements are tested in
tests/integration/ (test_worker.py, test_notification_queue.py, test_wakeup.py)."""

from __future__ import annotations

import uuid

import pytest
from django.db import OperationalError

from delivery.repositories import Reclaimed
from delivery.upkeep import ClaimReclaimer, WindowPruner


class Windows:
    def __init__(self, pruned: int = 0, error: Exception | None = None) -> None:
        self.pruned, self.error = pruned, error
        self.calls: list[dict] = []

    def ratelimit_prune(self, *, window_s, limit):
        self.calls.append({"window_s": window_s, "limit": limit})
        if self.error:
            raise self.error
        return self.pruned


def test_the_window_pruner_is_due_after_a_batch_of_admissions_and_counts_one_batch_off_a_prune():
    windows = Windows(pruned=7)
    pruner = WindowPruner(repository=windows, window_s=60, batch=100)
    pruner.admitted = 99
    assert not pruner.due
    pruner.admitted = 250
    assert pruner.due
    assert pruner.run_once() == 7
    assert windows.calls == [{"window_s": 60, "limit": 100}]
    assert pruner.admitted == 150 and pruner.due  # one bounded statement a turn
    pruner.run_once()
    pruner.run_once()
    assert pruner.admitted == 0 and not pruner.due


def test_a_prune_the_database_refused_stays_due():
    pruner = WindowPruner(
        repository=Windows(error=OperationalError("lock timeout")), window_s=60, batch=100
    )
    pruner.admitted = 100
    with pytest.raises(OperationalError):
        pruner.run_once()
    assert pruner.admitted == 100 and pruner.due


def test_the_reclaimer_returns_how_many_claims_came_back_and_logs_each(caplog):
    rows = [
        Reclaimed(uuid.uuid4(), "PENDING", "dead_worker"),
        Reclaimed(uuid.uuid4(), "DEAD_LETTERED", "claim_timeout"),
    ]

    class Queue:
        def notification_reclaim_expired(self, *, dead_after_s):
            assert dead_after_s == 30
            return rows

    caplog.set_level("WARNING", logger="notifyqueue.delivery")
    reclaimer = ClaimReclaimer(repository=Queue(), worker_id="w-1", dead_after_s=30)
    assert reclaimer.run_once() == 2
    logged = [r.getMessage() for r in caplog.records]
    assert logged == [
        f"claim taken back notification={rows[0].id} cause=dead_worker status=PENDING worker=w-1",
        f"claim taken back notification={rows[1].id} cause=claim_timeout status=DEAD_LETTERED "
        "worker=w-1",
    ]
