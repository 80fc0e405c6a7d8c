"""The worker's upkeep services (delivery/upkeep.py) over in-memory stand-ins: what each
`run_once()` does and returns. No database; their statements are tested in
tests/integration/ (test_worker.py, test_notification_queue.py, test_wakeup.py)."""

from __future__ import annotations

import time
import uuid

import pytest
from django.db import OperationalError

from delivery.checks import worker_liveness_settings_check
from delivery.repositories import Reclaimed
from delivery.upkeep import ClaimReclaimer, Heartbeat, WindowPruner


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


class Beats:
    """The heartbeat's statements: the row's wake-up mark as `marked` says."""

    def __init__(self, *, marked: bool = False) -> None:
        self.marked = marked
        self.beats = 0

    def worker_heartbeat(self, *, worker, hostname, pid, delivered):
        self.beats += 1
        return self.marked

    def worker_waiting_clear_stale(self, *, seconds):
        return 0


def test_a_worker_trusts_its_claims_until_a_heartbeat_before_the_dead_after():
    now = [100.0]
    heartbeat = Heartbeat(
        repository=Beats(), worker_id="w", interval_s=1, dead_after_s=5, clock=lambda: now[0]
    )
    # Before the first beat nothing vouches for the worker and nothing takes its claims.
    assert heartbeat.alive() and heartbeat.holds(50.0)
    heartbeat.run_once(delivered=0, waiting=False)  # seen at 100: dead for the others at 105
    now[0] = 103.9
    assert heartbeat.alive() and heartbeat.holds(100.0)
    now[0] = 104.0  # a heartbeat before that: no new claim, no send of an old one
    assert not heartbeat.alive() and not heartbeat.holds(100.0)


def test_a_beat_after_a_lapse_disowns_every_claim_made_before_it():
    """Frozen (SIGSTOP) or cut off past the point where others may take it for dead, the
    worker resumes: its claims from before may be another's now, and are never sent."""
    now = [100.0]
    heartbeat = Heartbeat(
        repository=Beats(), worker_id="w", interval_s=1, dead_after_s=5, clock=lambda: now[0]
    )
    heartbeat.run_once(delivered=0, waiting=False)
    now[0] = 130.0
    heartbeat.run_once(delivered=0, waiting=False)
    assert heartbeat.alive()
    assert not heartbeat.holds(100.0) and not heartbeat.holds(129.9)
    assert heartbeat.holds(130.0)
    now[0] = 133.5  # beats on time again: no lapse, the claims since 130 stay its own
    heartbeat.run_once(delivered=0, waiting=False)
    assert heartbeat.holds(130.0) and not heartbeat.holds(129.9)


def test_without_a_dead_after_a_worker_is_never_judged_by_its_heartbeat():
    now = [100.0]
    heartbeat = Heartbeat(repository=Beats(), worker_id="w", interval_s=1, clock=lambda: now[0])
    heartbeat.run_once(delivered=0, waiting=False)
    now[0] = 10_000.0
    assert heartbeat.alive() and heartbeat.holds(100.0)


def test_a_beat_that_finds_the_wake_up_mark_gone_tells_the_loop():
    lost = Heartbeat(repository=Beats(marked=False), worker_id="w", interval_s=1)
    lost.run_once(delivered=0, waiting=True)
    assert lost.mark_lost.is_set()
    kept = Heartbeat(repository=Beats(marked=True), worker_id="w", interval_s=1)
    kept.run_once(delivered=0, waiting=True)
    unwanted = Heartbeat(repository=Beats(marked=False), worker_id="w", interval_s=1)
    unwanted.run_once(delivered=0, waiting=False)
    assert not kept.mark_lost.is_set() and not unwanted.mark_lost.is_set()


def test_the_heartbeats_thread_keeps_beating_through_database_errors():
    class Flaky(Beats):
        def worker_heartbeat(self, **kwargs):
            self.beats += 1
            if self.beats in (2, 3):
                raise OperationalError("terminating connection due to administrator command")
            return False

    beats = Flaky()
    heartbeat = Heartbeat(repository=beats, worker_id="w", interval_s=0.01, dead_after_s=0.05)
    heartbeat.start(state=lambda: (0, False))
    try:
        deadline = time.monotonic() + 5
        while beats.beats < 6 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        heartbeat.stop()
    assert beats.beats >= 6


@pytest.mark.parametrize(
    "heartbeat_s, dead_after_s, ok",
    [(5, 30, True), (1, 3, True), (1, 2.9, False), (5, 5, False), (0, 30, False)],
)
def test_the_dead_after_must_span_three_heartbeats(settings, heartbeat_s, dead_after_s, ok):
    settings.NOTIFYQUEUE_HEARTBEAT_SECONDS = heartbeat_s
    settings.NOTIFYQUEUE_WORKER_DEAD_AFTER_SECONDS = dead_after_s
    errors = worker_liveness_settings_check(None)
    assert (not errors) == ok, errors


def test_a_nan_dead_after_is_refused(settings):
    settings.NOTIFYQUEUE_WORKER_DEAD_AFTER_SECONDS = float("nan")
    assert [e.id for e in worker_liveness_settings_check(None)] == ["delivery.E002"]
