"""The delivery worker: claims due notifications, delivers them, records the results.

`Worker.run_once()` is one step and returns what it did: collect the provider answers that
are in, claim as many due rows as there are free delivery slots (at most batch_size), run the
send-time checks for the whole claim (delivery/send_checks.py: preferences, then the rate
limit in one statement, then the circuit), start the sends, and record every result of the
step in one statement (after the step's circuit refusals, held without using an attempt, in
one more); when a wake-up arrived during the step, its results wait for the next step, which
claims first (at most RECORD_WAIT_S). `Worker.run()` wraps it in a loop with LISTEN/NOTIFY
wake-ups (delivery/wakeup.py) that calls the database upkeep (delivery/upkeep.py: takeover of
dead workers' and expired claims, rate-window prune, statistics, queue vacuum) on their
intervals, one job a turn.

All database work but the heartbeat happens on the loop's thread, on one connection; the
heartbeat has a thread and a connection of its own (delivery/upkeep.py), so a slow step never
makes a live worker look dead, and the worker sends no claim it may have lost to another
while its beats lapsed (`Heartbeat.holds`). Provider calls run on
`concurrency` threads that never touch the database (delivery/sending.py), so no lock and no
connection is held while a provider answers. A provider whose sending is a write to our own
database (the simulated provider, the in-app inbox) takes the whole claim in one call on the
loop instead (`BatchProvider`).

A worker holds at most `concurrency` calls in flight and a few claims more waiting, ready,
for a send thread: as many as slots free while the loop turns once, at most half the
concurrency again (`Sends.ready_size`; none with `--concurrency 1`): when a provider answers,
its thread starts the next waiting call at once, without waiting for the loop's next claim,
and on a slow provider the other slots are claimed when they free, in the turns of that
moment. The waiting claims go CRITICAL first, so a CRITICAL claimed now passes them, then
those of the client with the fewest calls running; one that could no longer be answered
before its claim expires is given back unsent, and so is every waiting claim when the worker
stops. Each claim tells the database what the worker holds per client (`Sends.held`), so a
client's turns are counted from there.
Every decision about time is the database's (see notifyqueue_now()); the worker's own clock
only measures how long it has held a claim (time.monotonic()).

Logging: one INFO summary line at most every second while there is work (claims and outcomes
counted), one DEBUG line per attempt, and a WARNING for what an operator should look at.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from django.db import DatabaseError, InterfaceError, OperationalError, connection

from delivery.circuits.services import Allowed, Circuit, CircuitPolicy, Refused, circuits_register
from delivery.providers.base import BatchProvider, Provider, ProviderResult, TemporaryFailure
from delivery.receipts.services import receipts_match_finished
from delivery.repositories import Claim, DeliveryRepository, Finish, Finished, Hold, QuietHeld
from delivery.send_checks import CircuitStage, send_checks_build
from delivery.sending import CALL_WEIGHT, Sends, Sent, message_of
from delivery.services import RetryPolicy, Router, attempt_finish, claim_expired, claim_release
from delivery.upkeep import (
    HISTORY_PARTITIONS_S,
    STATISTICS_CHECK_S,
    ClaimReclaimer,
    ExpiryFinisher,
    Heartbeat,
    HistoryPartitions,
    QueueVacuumer,
    ReceiptUpkeep,
    StatisticsRefresher,
    WindowPruner,
)
from delivery.wakeup import WakeupListener
from monitoring.metrics import DELIVERY as metrics
from notifications.digests import DigestCloser
from notifyqueue.outage import OutageLog
from preferences.routing import PreferenceRouter
from ratelimits.repositories import RateLimitRepository
from ratelimits.services import RateLimit
from suppressions.repositories import SuppressionRepository

log = logging.getLogger("notifyqueue.delivery")

# The most often a worker writes its INFO summary line.
LOG_SUMMARY_S = 1.0
# How often a worker sweeps the pending receipts and prunes the old ones.
RECEIPT_UPKEEP_S = 10.0
# The longest a step's results wait for a later step while wake-ups keep arriving (see
# `Worker._record_now`).
RECORD_WAIT_S = 0.05


def worker_id_new() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class StepResult:
    claimed: int
    finished: int
    in_flight: int


@dataclass(frozen=True)
class WorkerConfig:
    concurrency: int = 8
    # The most rows one claim takes. Each claim, admission and finish statement has a fixed
    # cost (planning, the statement-level triggers, the commit) shared by its rows: with a
    # batch provider, 250 a claim cost PostgreSQL 96-103 us a row against 100's 115-120 us
    # (500 and 1,000 no less). Claims for providers
    # called one message at a time are bounded by the free send slots anyway.
    batch_size: int = 250
    claim_timeout_s: float = 300.0
    # A NORMAL or LOW row moves up one priority level (never above HIGH) for each period it
    # has waited past its due time (NOTIFYQUEUE_PRIORITY_AGING_SECONDS); 0: never.
    priority_aging_s: float = 300.0
    # The longest a provider call may take (NOTIFYQUEUE_PROVIDER_TIMEOUT_SECONDS): a send is
    # started only while at least this much of its claim is left.
    send_timeout_s: float = 0.0
    poll_interval_s: float = 1.0
    heartbeat_s: float = 5.0
    # NOTIFYQUEUE_WORKER_DEAD_AFTER_SECONDS: a worker whose heartbeat is older is dead, and
    # its claims are taken over (delivery/upkeep.py). None: no worker is judged by its
    # heartbeat (only claim timeouts hand claims over), as in tests of other behaviour.
    dead_after_s: float | None = None
    # None switches the per-recipient limit off (tests of other behaviour use this).
    rate_limit: RateLimit | None = None
    # None switches the per-provider circuit breakers off (likewise).
    circuit: CircuitPolicy | None = None
    # Window rows the prune deletes per statement (see delivery.upkeep.WindowPruner).
    prune_batch: int = 10_000
    # The channels whose providers send delivery receipts (an events secret is set): their
    # sent messages' pending receipts are matched after each finish. Any channel's are also
    # found by the upkeep's sweep (delivery.upkeep.ReceiptUpkeep).
    receipt_channels: frozenset[str] = frozenset()
    receipt_pending_s: float = 86400.0
    receipt_tolerance_s: float = 300.0
    # Waiting notifications past their expiry ended per statement (upkeep.ExpiryFinisher).
    expire_batch: int = 1_000


class Worker:
    def __init__(
        self,
        *,
        providers: dict[str, Provider],
        config: WorkerConfig,
        policy: RetryPolicy,
        worker_id: str | None = None,
        repository: DeliveryRepository | None = None,
        rng: random.Random | None = None,
        router: Router | None = None,
        rate_limits: RateLimitRepository | None = None,
        suppressions: SuppressionRepository | None = None,
    ) -> None:
        self.providers = providers
        self.config = config
        self.policy = policy
        self.worker_id = worker_id or worker_id_new()
        self.repository = repository or DeliveryRepository()
        self.rng = rng or random.Random()
        self.rate_limits = rate_limits or RateLimitRepository()
        self.router = router or PreferenceRouter()
        # In-app delivery is a row in our own database: there is no provider to isolate.
        self.circuits = {
            channel: Circuit(f"{channel}:{provider.name}", config.circuit)
            for channel, provider in providers.items()
            if config.circuit and channel != "in_app"
        }
        self.delivered = 0
        # The database upkeep (delivery/upkeep.py), each called by `_maintain` on its interval.
        self.heartbeat = Heartbeat(
            repository=self.repository,
            worker_id=self.worker_id,
            interval_s=config.heartbeat_s,
            dead_after_s=config.dead_after_s,
        )
        self.reclaimer = ClaimReclaimer(
            repository=self.repository,
            worker_id=self.worker_id,
            dead_after_s=config.dead_after_s,
        )
        self.expiry = ExpiryFinisher(
            repository=self.repository, worker_id=self.worker_id, batch=config.expire_batch
        )
        # Digest buckets whose window ended (notifications/digests.py).
        self.digests = DigestCloser(
            worker_id=self.worker_id,
            claim_s=config.claim_timeout_s,
            dead_after_s=config.dead_after_s,
        )
        self.window_pruner = (
            WindowPruner(
                repository=self.rate_limits,
                window_s=config.rate_limit.window_s,
                batch=config.prune_batch,
            )
            if config.rate_limit
            else None
        )
        self.history = HistoryPartitions(repository=self.repository, worker_id=self.worker_id)
        self.statistics = StatisticsRefresher(repository=self.repository, worker_id=self.worker_id)
        self.queue_vacuum = QueueVacuumer(repository=self.repository, worker_id=self.worker_id)
        self.receipt_upkeep = ReceiptUpkeep(
            pending_age_s=config.receipt_pending_s,
            # An event id is remembered for twice the signature's tolerance: past that its
            # signature is stale anyway, so a replay is refused without it.
            seen_age_s=2 * config.receipt_tolerance_s,
        )
        # The send-time checks (delivery/send_checks.py): the stages run over a whole claim,
        # then the circuit's per call.
        self.checks = send_checks_build(
            router=self.router,
            repository=self.repository,
            quiet_held=self._quiet_held,
            suppressions=suppressions or SuppressionRepository(),
            rate_limit=config.rate_limit,
            rate_limits=self.rate_limits,
            pruner=self.window_pruner,
            end=self._finishes_add,
            fail=self._checks_failed,
            deferred=self._rate_limited,
            worker_id=self.worker_id,
        )
        self.circuit_stage = CircuitStage(self.circuits)
        # Results not yet recorded: this step's, or an earlier step's the database refused.
        self._finishes: list[Finish] = []
        # Claims the circuit refused, not yet given back (recorded with the results).
        self._holds: list[tuple[Claim, str]] = []
        # Claims that passed the checks, whose send must be marked started in the database
        # before it starts (`Claim.start_checked`), waiting for an idle send thread: marked
        # only once one is free, so none is marked and then waits (see `_launch`).
        self._unstarted: list[tuple[Claim, float, float, float]] = []
        # Since when the results not yet recorded (`_finishes`, `_holds`) have waited for a
        # later step (time.monotonic(); see `_record_now`); None while none wait.
        self._unrecorded_since: float | None = None
        # Claims and outcomes since the last summary line (LOG_SUMMARY_S).
        self._counts: Counter[str] = Counter()
        self._summary_at = time.monotonic()
        self._next_maintenance = 0.0
        self._next_statistics_check = 0.0
        self._next_receipt_upkeep = 0.0
        self._next_history_partitions = 0.0
        # The upkeep due at the last heartbeat interval (and the receipts' every
        # RECEIPT_UPKEEP_S) not yet run: one job a turn (see `_maintain`).
        self._upkeep: list[Callable[[], object]] = []
        # Each circuit has its row before the first claim (see _maintain).
        self._circuits_registered = False
        # The heartbeat's thread runs from the loop's first turn until it stops (_maintain).
        self._beating = False
        self._stopping = threading.Event()
        # Set by a provider's answer, a NOTIFY and stop(): whatever the idle loop waits for.
        self._wake = threading.Event()
        # The loop's claims: `_dry` once a claim came back short (nothing more is due), until
        # a NOTIFY (`_notified`) or the next row's due time (`_due_check_at`) says otherwise;
        # meanwhile steps only record answers, without a claim statement each.
        self._notified = threading.Event()
        self._dry = False
        self._due_check_at = 0.0
        # A full claim after a short one starts a burst: the queue's statistics may still
        # describe the quiet queue, so they are checked at the next turn against the rows
        # that claim took (`StatisticsRefresher`).
        self._claims_full = False
        self._burst_rows = 0
        # Whether the worker's heartbeat row asks the creates for wake-ups (`_waiting_mark`):
        # marked before it first sleeps, cleared when its claims come back full.
        self._waiting = False
        # Up to half the concurrency again is claimed ahead and waits, ready, for a send
        # thread: a slot a provider frees starts its next call at once instead of after the
        # loop's next claim statement. How many is sized to the provider each step
        # (`Sends.ready_size`): about the slots that free during one turn of the loop (a
        # turn: a step that claims, its results recorded; `_turnaround_s`, a moving average,
        # None until a step has claimed).
        self._turnaround_s: float | None = None
        self._sends = Sends(
            config.concurrency,
            self._wake,
            waiting=config.concurrency // 2,
            stopping=self._stopping,
            holds=self.heartbeat.holds,
        )
        # The channels whose provider takes a whole claim at once, found once: an isinstance
        # check against a runtime-checkable Protocol walks its attributes (~5 µs a claim).
        self._batch_channels = frozenset(
            channel for channel, p in providers.items() if isinstance(p, BatchProvider)
        )
        # With only batch providers nothing is left in flight after a step, so a claim may
        # take a whole batch whatever the number of send threads.
        self._all_batch = self._batch_channels == set(providers)

    # --- one step -------------------------------------------------------------------------

    def run_once(self, *, wait_s: float = 0.0, claim: bool = True) -> StepResult:
        """Collects the answers that are in (waiting up to `wait_s` for one), claims as many
        rows as there are free delivery slots (at most batch_size) unless the worker is
        stopping (or `claim` is false), starts them, and records every result not yet
        recorded in one statement, unless a wake-up arrived meanwhile (`_record_now`)."""
        for sent in self._sends.collect(wait_s):
            self._finishes.append(self._settle(sent))
        turn_began = time.monotonic()
        self._release_withdrawn()
        if self._unstarted:
            unstarted, self._unstarted = self._unstarted, []
            self._launch(unstarted)
        claimed = 0
        self._sends.ready_size(self._turnaround_s)
        # Batch providers finish within the step: only send threads limit what may be claimed.
        free = (
            self.config.batch_size
            if self._all_batch
            else min(self.config.batch_size, self._sends.free - len(self._unstarted))
        )
        # A worker whose heartbeat may have lapsed claims nothing: others may be taking its
        # claims over, and it would only give back what it took (see Heartbeat.holds).
        if claim and not self._stopping.is_set() and free > 0 and self.heartbeat.alive():
            claimed_at = time.monotonic()
            claims = self.repository.notification_claim_due(
                worker=self.worker_id,
                limit=free,
                claim_timeout_s=self.config.claim_timeout_s,
                aging_s=self.config.priority_aging_s,
                held=self._sends.held(),
            )
            if claims:
                start_by = claimed_at + self.config.claim_timeout_s - self.config.send_timeout_s
                self._start(claims, start_by=start_by, claimed_at=claimed_at)
            claimed = len(claims)
            self._dry = claimed < free
            if not self._dry and not self._claims_full:
                self._burst_rows = claimed
                self._next_statistics_check = 0.0
            self._claims_full = not self._dry
        finished = self._record() if self._record_now() else 0
        if claimed:
            self._counts["claimed"] += claimed
            took = time.monotonic() - turn_began
            last = self._turnaround_s
            self._turnaround_s = took if last is None else last + CALL_WEIGHT * (took - last)
        self._log_summary()
        return StepResult(
            claimed=claimed,
            finished=finished,
            in_flight=self._sends.outstanding + len(self._unstarted),
        )

    def _reclaim(self) -> int:
        """Takes back the claims of dead workers and the claims past their timeout, then
        prunes the rate windows; how many claims came back."""
        reclaimed = self.reclaimer.run_once()
        if self.window_pruner:
            self.window_pruner.run_once()
        return reclaimed

    # --- the loop -------------------------------------------------------------------------

    def _notify(self) -> None:
        """A row may have become due (a NOTIFY, or the listener's (re)connection)."""
        self._notified.set()
        self._wake.set()

    def stop(self) -> None:
        """Asks the loop to stop claiming; safe to call from a signal handler."""
        self._stopping.set()
        self._wake.set()

    def run(self, *, until_empty: bool = False) -> None:
        """Runs until `stop()` (or, with `until_empty`, until nothing is due or in flight);
        then finishes in-flight deliveries, records them and returns. A lost database
        connection is logged and retried, never fatal."""
        listener = WakeupListener(self._notify, retry_s=self.config.poll_interval_s)
        listener.start()
        self._next_maintenance = 0.0
        outage = OutageLog(log, f"delivery loop worker={self.worker_id}")
        try:
            while not self._stopping.is_set():
                try:
                    if not self._loop_once(until_empty=until_empty):
                        break
                    outage.succeeded()
                except DatabaseError:
                    # Lost or refused (a restart, a failover): a new connection next turn,
                    # to whichever server DATABASE_URL's hosts name as writable by then.
                    outage.failed(self.config.poll_interval_s)
                    connection.close()
                    self._stopping.wait(self.config.poll_interval_s)
        finally:
            self._shutdown()
            listener.close()

    def _loop_once(self, *, until_empty: bool) -> bool:
        """One turn of the loop; False once `until_empty` finds nothing left to do."""
        self._maintain(time.monotonic())
        self._wake.clear()  # a wake-up from now on ends the wait below at once
        # Claim unless the last claim found nothing more and nothing may have become due
        # since (a NOTIFY, the next row's due time).
        claim = not self._dry or self._notified.is_set() or time.monotonic() >= self._due_check_at
        if claim:
            self._notified.clear()
        step = self.run_once(claim=claim)
        if claim and self._dry:
            if not self._waiting:
                self._waiting_mark()
                return True  # claims again before sleeping: see _waiting_mark
            # A NOTIFY since the claim: the next turn claims at once, and the next row's due
            # time would go unused (at a steady rate of creates, most dry turns).
            if not self._notified.is_set():
                self._due_check_at = time.monotonic() + self._idle_wait_s()
        if not self._dry and step.claimed:
            if self._waiting:
                # Busy: the creates need not wake this worker (`notification_wakeup`).
                self.repository.worker_waiting_clear(worker=self.worker_id)
                self._waiting = False
            return True  # the claim was full: more may be due
        # Exit only on a claim that found nothing: the fair claim can come back short (each
        # client capped at its share) while rows are still due.
        if (
            until_empty
            and claim
            and not step.claimed
            and not step.in_flight
            and not self._finishes
            and not self._holds
        ):
            # The upkeep left, and a digest's close under way (a large bucket takes several
            # turns), end first.
            if not self._reclaim() and not self._upkeep and not self.digests.due:
                return False
            self._dry = False
            return True
        until = self._next_maintenance
        if self._dry and self._sends.free > 0:
            until = min(until, self._due_check_at)
        if self._upkeep or self.digests.due:  # upkeep under way goes on at the next turn
            until = 0.0
        self._wake.wait(max(0.0, until - time.monotonic()))
        return True

    def _maintain(self, now: float) -> None:
        """What is due at `now` (time.monotonic()): first of all the circuits' rows and the
        first heartbeat, which starts the heartbeat's own thread (until written: a worker
        whose connection drops as it starts retries, as any turn of the loop does, rather
        than exiting); its wake-up mark again if a beat found it cleared; one job of the
        upkeep a turn, the next turn at once while any is left: every heartbeat_s the
        takeover of dead workers' and expired claims, the end of waiting rows past their
        expiry, the digests' close and a prune of the rate windows, and every
        RECEIPT_UPKEEP_S the receipts' sweep, and at the start and every HISTORY_PARTITIONS_S
        the history tables' coming weeks; with none left, the next batch of an expiry
        or a digest close that came back full; a prune of the rate windows per `prune_batch`
        deliveries admitted; the hot tables' statistics every
        STATISTICS_CHECK_S, so a busy worker refreshes them within a second of a burst, and at
        once when a burst begins (see run_once), and at the same checks, once a drain is over
        (nothing was due at the last claim), the queue's dead rows."""
        if not self._circuits_registered:
            circuits_register(list(self.circuits.values()))
            self._circuits_registered = True
        if not self._beating:
            self.heartbeat.start(state=lambda: (self.delivered, self._waiting))
            self._beating = True
        if self.heartbeat.mark_lost.is_set():
            # Taken for dead while it slept (or stalled): creates no longer notify for it.
            self.heartbeat.mark_lost.clear()
            if self._waiting:
                self._waiting_mark()
        if now >= self._next_maintenance:
            self._upkeep_add(self._reclaim_claims, self.expiry.run_once, self._close_digests)
            if self.window_pruner:
                self._upkeep_add(self.window_pruner.run_once)
            self._next_maintenance = now + self.config.heartbeat_s
        if now >= self._next_history_partitions:
            self._upkeep_add(self.history.run_once)
            self._next_history_partitions = now + HISTORY_PARTITIONS_S
        if now >= self._next_receipt_upkeep:
            self._upkeep_add(self.receipt_upkeep.run_once)
            self._next_receipt_upkeep = now + RECEIPT_UPKEEP_S
        # One job a turn: together they held the turn (and the rows created meanwhile) for
        # 10-20 ms, 30-150 ms on a busy host; one at a time, each row waits for one at most.
        if self._upkeep:
            self._upkeep.pop(0)()
        elif self.expiry.due:
            self.expiry.run_once()
        elif self.digests.due:
            self._close_digests()
        if self.window_pruner and self.window_pruner.due:
            self.window_pruner.run_once()
        if now >= self._next_statistics_check:
            self.statistics.run_once(queue_rows=self._burst_rows)
            self._burst_rows = 0
            if self._dry:
                self.queue_vacuum.run_once()
            self._next_statistics_check = now + STATISTICS_CHECK_S

    def _upkeep_add(self, *jobs: Callable[[], object]) -> None:
        """Queues upkeep jobs, each once however many intervals pass before it runs."""
        self._upkeep += [job for job in jobs if job not in self._upkeep]

    def _reclaim_claims(self) -> None:
        """The upkeep's takeover of dead workers' and expired claims; a claim that came back
        is due now, so the next claim looks."""
        if self.reclaimer.run_once():
            self._dry = False

    def _close_digests(self) -> None:
        """The digest close's turn; a digest created is due now, so the next claim looks."""
        if self.digests.run_once():
            self._dry = False

    def _waiting_mark(self) -> None:
        """Asks the creates for wake-ups before the worker first sleeps: a create notifies
        (at its commit) only while some worker is marked (`notification_wakeup`). The mark
        waits for the creates already past that check, so the claim the loop makes next,
        before it sleeps, sees their rows."""
        self.repository.worker_waiting_mark(worker=self.worker_id)
        self._waiting = True
        self._dry = False

    def _idle_wait_s(self) -> float:
        """Sleeps until the next row is due, but never longer than the poll interval, so a
        lost wake-up costs at most one interval."""
        until_due = self.repository.notification_next_due_in()
        if until_due is None:
            return self.config.poll_interval_s
        return max(0.0, min(until_due, self.config.poll_interval_s))

    def _shutdown(self) -> None:
        try:
            # Claims waiting for a send thread have not started: given back, attempts returned.
            self._release_withdrawn()
            self._finishes += [claim_release(claim) for claim, *_ in self._unstarted]
            self._unstarted = []
            while self._sends.outstanding or self._finishes or self._holds:
                for sent in self._sends.collect(wait_s=0.1):
                    self._finishes.append(self._settle(sent))
                self._record()
            # The beats end before the row says stopped: a later beat would undo it.
            self.heartbeat.stop()
            self.repository.worker_stopped(worker=self.worker_id, delivered=self.delivered)
            self._log_summary(force=True)
        except DatabaseError:
            # The claims stay PROCESSING until the worker is taken for dead (its beats end
            # with it) or they expire; another worker then re-sends them with the same
            # idempotency keys, so nothing is lost or sent twice.
            log.exception(
                "could not record %d results at shutdown worker=%s",
                len(self._finishes),
                self.worker_id,
            )
        finally:
            self.heartbeat.stop()
            self._beating = False  # a later run() beats again
            self._sends.close()
            self.queue_vacuum.join(timeout=30)

    # --- starting a claim -----------------------------------------------------------------

    def _start(self, claims: list[Claim], *, start_by: float, claimed_at: float) -> None:
        """The send-time checks for the whole claim, then the sends. Every claim either
        starts or ends here with a result to record (or was settled by a deferral), or waits
        in `_unstarted` for an idle send thread."""
        started = time.monotonic()
        self._launch(
            [(claim, started, start_by, claimed_at) for claim in self.checks.passing(claims)]
        )

    def _launch(self, claims: list[tuple[Claim, float, float, float]]) -> None:
        """Claims that passed the checks: each is released (the worker is stopping, or too
        little of its claim is left), held (its circuit is open), or sent. A claim whose send
        must be marked started (`Claim.start_checked`) is sent only on an idle send thread,
        right after the mark (`_send_start`); without one it waits in `_unstarted`, unmarked,
        so a cancel can still take it."""
        batches: dict[int, tuple[Provider, list[tuple[Claim, Allowed | None]]]] = {}
        threaded: list[tuple[Claim, Allowed | None, float, float, float]] = []
        idle = self._sends.idle
        for claim, started, start_by, claimed_at in claims:
            if self._stopping.is_set():
                # SIGTERM arrived while the claim was being checked: what has not started is
                # given back, its attempt returned (contract: run_worker's shutdown).
                self._finishes.append(claim_release(claim))
                continue
            if time.monotonic() >= start_by or not self.heartbeat.holds(claimed_at):
                # Too little of the claim is left for the provider to answer before another
                # worker may take it over, or the heartbeat lapsed since the claim (another
                # may have taken it already): give it back unsent, its attempt returned (the
                # release names the claim token: a claim taken over changes nothing).
                log.warning(
                    "claim too old to start notification=%s worker=%s; released",
                    claim.id,
                    self.worker_id,
                )
                self._finishes.append(claim_release(claim))
                continue
            in_batch = claim.channel in self._batch_channels
            if claim.start_checked and not in_batch:
                if idle <= 0:
                    self._unstarted.append((claim, started, start_by, claimed_at))
                    continue
                idle -= 1
            admission = self.circuit_stage.admit(claim.channel)
            if isinstance(admission, Refused):
                # The provider was never asked: held, no attempt used (`_record`).
                self._holds.append((claim, self.circuits[claim.channel].name))
                continue
            provider = self.providers[claim.channel]
            if in_batch:
                batches.setdefault(id(provider), (provider, []))[1].append((claim, admission))
            else:
                threaded.append((claim, admission, started, start_by, claimed_at))
        checked = [item[0] for item in threaded if item[0].start_checked]
        checked += [c for _, items in batches.values() for c, _ in items if c.start_checked]
        startable = self._send_start(checked)
        # The marked ones first: each takes an idle thread (only the loop submits, so none
        # took them meanwhile); the others may wait for one.
        threaded.sort(key=lambda item: not item[0].start_checked)
        for claim, admission, started, start_by, claimed_at in threaded:
            if startable(claim):
                provider = self.providers[claim.channel]
                self._sends.submit(
                    provider, claim, admission, started, start_by=start_by, claimed_at=claimed_at
                )
        now = time.monotonic()
        for provider, items in batches.values():
            items = [(claim, admission) for claim, admission in items if startable(claim)]
            if not items:
                continue
            for (claim, admission), result in zip(
                items, _batch_send(provider, [claim for claim, _ in items]), strict=True
            ):
                self._finishes.append(self._settle(Sent(claim, admission, result, now)))

    def _send_start(self, claims: list[Claim]) -> Callable[[Claim], bool]:
        """Marks the sends of `claims` started in one statement, just before they start
        (`notification_send_start`); returns whether a claim may be sent. A claim expired
        meanwhile ends EXPIRED; one cancelled meanwhile (or taken over) is dropped: it was
        ended by whoever took it. If the statement fails, none of them is sent: each is a
        failed attempt, as when the send-time checks fail."""
        if not claims:
            return _always
        try:
            states = self.repository.notification_send_start(claims)
        except (OperationalError, InterfaceError):
            raise
        except DatabaseError as exc:
            for claim in claims:
                self._checks_failed(claim, exc)
            return lambda claim: not claim.start_checked
        for claim in claims:
            state = states.get(claim.id)
            if state == "expired":
                self._finishes.append(claim_expired(claim))
            elif state is None:
                log.info(
                    "not sent notification=%s client=%s channel=%s: cancelled or taken over "
                    "before its send started worker=%s",
                    claim.id,
                    claim.client_id,
                    claim.channel,
                    self.worker_id,
                )
                self._counts["CANCELLED"] += 1
        return lambda claim: not claim.start_checked or states.get(claim.id) == "started"

    def _release_withdrawn(self) -> None:
        """Gives back the claims that waited for a send thread and must not start now: all of
        them once the worker is stopping, else those too old to start (see `_start`)."""
        for claim in self._sends.withdrawn(everything=self._stopping.is_set()):
            if not self._stopping.is_set():
                log.warning(
                    "claim too old to start notification=%s worker=%s; released",
                    claim.id,
                    self.worker_id,
                )
            self._finishes.append(claim_release(claim))

    def _finishes_add(self, finish: Finish) -> None:
        """A claim that ended in a send-time check: its result is recorded with the step's."""
        self._finishes.append(finish)

    def _checks_failed(self, claim: Claim, exc: DatabaseError) -> None:
        """Nothing was sent. A failed attempt, not a release: it backs off, and a row that
        breaks the checks every time runs out of attempts instead of looping. But when the
        connection itself was lost (a restart, a failover), the row is not at fault: it is
        given back with its attempt returned, written once the database answers (the loop
        logs the outage), so an outage uses up no one's attempts."""
        if _connection_lost():
            self._finishes.append(claim_release(claim))
            return
        log.error("send-time checks failed notification=%s: %r", claim.id, exc)
        result = TemporaryFailure(f"send-time checks failed: {type(exc).__name__}")
        self._finishes.append(self._settle(Sent(claim, None, result, time.monotonic())))

    def _rate_limited(self) -> None:
        self._counts["RATE_LIMITED"] += 1

    def _quiet_held(self, claim: Claim, held: QuietHeld) -> None:
        """The user's quiet hours held the claim: PENDING until the window's end, no attempt
        used (settled by the stage's statement)."""
        self._counts["QUIET_HOURS_HELD"] += 1
        metrics.quiet_hours_held(channel=claim.channel)
        log.debug(
            "quiet hours notification=%s client=%s channel=%s status=PENDING held_until=%s "
            "worker=%s",
            claim.id,
            claim.client_id,
            claim.channel,
            held.held_until.isoformat(),
            self.worker_id,
        )

    # --- ending a claim -------------------------------------------------------------------

    def _settle(self, sent: Sent) -> Finish:
        """Turns a provider's answer into the row's next state, reporting it to the circuit.
        An unexpected error still ends the claim: a failed attempt, retried after its backoff
        under the same idempotency key, so the row never waits out its claim timeout."""
        claim, result = sent.claim, sent.result
        circuit = self.circuits.get(claim.channel)
        if circuit and sent.admission is not None:
            try:
                if circuit.record(sent.admission, result):
                    self._circuit_closed(claim.channel, circuit.name)
            except DatabaseError:
                log.exception("circuit %s not updated after a send", circuit.name)
        try:
            finish = attempt_finish(
                claim, result, policy=self.policy, rng=self.rng, router=self.router
            )
        except Exception:
            # The fallback look-up failed after the provider answered: the answer is still
            # recorded, as if no fallback were left.
            log.exception("fallback look-up failed notification=%s", claim.id)
            finish = attempt_finish(claim, result, policy=self.policy, rng=self.rng)
        try:
            metrics.attempt_finished(claim, finish, duration_s=time.monotonic() - sent.started)
        except Exception:
            log.exception("attempt metrics not updated notification=%s", claim.id)
        log.debug(
            "attempt finished notification=%s client=%s channel=%s attempt=%d outcome=%s "
            "status=%s worker=%s",
            claim.id,
            claim.client_id,
            claim.channel,
            claim.attempt_count,
            finish.outcome,
            finish.status,
            self.worker_id,
        )
        return finish

    def _circuit_closed(self, channel: str, name: str) -> None:
        """This worker's probe closed the circuit: the rows it held are due now, not at the
        probe time they were given."""
        released = self.repository.notification_circuit_release(channel=channel)
        log.info(
            "circuit %s closed; %d held notifications due now worker=%s",
            name,
            released,
            self.worker_id,
        )

    def _record_now(self) -> bool:
        """Whether the step records its results now. A wake-up that arrived since the claim
        means a row waits to be claimed: the results wait for the next step instead, which
        claims first, so the row is not held up by this finish statement, and at a steady
        rate of creates one statement records the results of several steps. They wait
        RECORD_WAIT_S at most, and never once a claim's worth are waiting or the worker is
        stopping."""
        if not self._finishes and not self._holds:
            return True
        now = time.monotonic()
        if self._unrecorded_since is None:
            self._unrecorded_since = now
        return (
            not self._notified.is_set()
            or self._stopping.is_set()
            or now - self._unrecorded_since >= RECORD_WAIT_S
            or len(self._finishes) + len(self._holds) >= self.config.batch_size
        )

    def _record(self) -> int:
        """Applies the step's holds in one statement, then its results in one more (row by
        row if that fails; see `notification_finish`). If the database is unreachable they are
        kept and applied with the next step's."""
        held = self._record_holds()
        finishes = self._finishes
        if not finishes:
            self._unrecorded_since = None
            return held
        finished = self.repository.notification_finish(finishes)  # raises: kept for later
        self._finishes = []
        self._unrecorded_since = None
        applied = {row.id: row.status for row in finished}
        self._release_freed_slots(finished)
        try:
            metrics.results_recorded(finishes, applied)
        except Exception:
            log.exception("result metrics not updated")
        for finish in finishes:
            if finish.id in applied:
                self._counts[finish.outcome] += 1
            else:
                log.warning(
                    "stale result ignored notification=%s outcome=%s worker=%s "
                    "(claim expired and was taken over)",
                    finish.id,
                    finish.outcome,
                    self.worker_id,
                )
        self.delivered += sum(1 for row in finished if row.status == "SENT")
        self._receipts_match(finishes, finished)
        return held + len(applied)

    def _receipts_match(self, finishes: list[Finish], finished: list[Finished]) -> None:
        """After the finish committed: the pending receipts of the messages it recorded as
        sent, on channels that take receipts (one statement; nothing without such a
        channel). A failure leaves them to the upkeep's sweep."""
        if not self.config.receipt_channels:
            return
        sent = {
            row.id: row.channel
            for row in finished
            if row.status == "SENT" and row.channel in self.config.receipt_channels
        }
        keys = [
            (sent[f.id], f.message_id)
            for f in finishes
            if f.id in sent and f.message_id is not None and f.status == "SENT"
        ]
        if not keys:
            return
        try:
            receipts_match_finished(keys)
        except DatabaseError:
            log.exception("pending receipts not matched at the finish; the sweep will")

    def _record_holds(self) -> int:
        """Gives back the claims the circuit refused, attempts returned, in one statement
        (`notification_circuit_hold`). If that fails for anything but a lost connection, they
        are released instead (due as before, attempts returned), so none waits for its claim
        to expire."""
        refused, policy = self._holds, self.config.circuit
        if not refused or policy is None:
            return 0
        holds = [Hold(claim.id, claim.claim_token, circuit) for claim, circuit in refused]
        try:
            held = self.repository.notification_circuit_hold(
                holds, cooldown_s=policy.cooldown_s, max_hold_s=policy.max_hold_s
            )
        except (OperationalError, InterfaceError):
            raise  # kept for the next step
        except DatabaseError:
            log.exception("hold of %d refused claims failed; released instead", len(holds))
            self._holds = []
            self._finishes += [claim_release(claim) for claim, _ in refused]
            return 0
        self._holds = []
        self._release_freed_slots(held)
        for row in held:
            self._counts["CIRCUIT_HELD" if row.held_until else "CIRCUIT_DEAD_LETTERED"] += 1
            log.debug(
                "circuit open notification=%s client=%s channel=%s outcome=CIRCUIT_HELD "
                "status=%s held_until=%s worker=%s",
                row.id,
                row.client_id,
                row.channel,
                row.status,
                row.held_until.isoformat() if row.held_until else None,
                self.worker_id,
            )
            if row.held_until is None:
                log.warning(
                    "held past the maximum hold notification=%s channel=%s status=%s",
                    row.id,
                    row.channel,
                    row.status,
                )
        return len(held)

    def _release_freed_slots(self, finished: list[Finished]) -> None:
        """Failed attempts gave back their rate-limit slots: the next row each recipient has
        waiting behind a deferral may go now instead of at its scheduled slot."""
        freed = [(r.channel, r.client_id, r.recipient, r.id) for r in finished if r.freed_slot]
        if freed and self.config.rate_limit:
            try:
                self.rate_limits.ratelimit_release_freed(freed)
            except DatabaseError:
                # Only an optimisation: the held rows still go at their scheduled slots.
                log.exception("freed rate-limit slots not passed on worker=%s", self.worker_id)

    def _log_summary(self, *, force: bool = False) -> None:
        """One INFO line for what the worker claimed and recorded since the last one, at most
        every LOG_SUMMARY_S: a busy worker's log grows with time, not with its messages or
        its steps. An idle worker logs nothing."""
        now = time.monotonic()
        if not (force or now - self._summary_at >= LOG_SUMMARY_S) or not any(self._counts.values()):
            return
        counts, self._counts = self._counts, Counter()
        log.info(
            "delivery claimed=%d %s in_flight=%d seconds=%.1f worker=%s",
            counts.pop("claimed", 0),
            " ".join(f"{outcome.lower()}={n}" for outcome, n in sorted(counts.items())),
            self._sends.outstanding,
            now - self._summary_at,
            self.worker_id,
        )
        self._summary_at = now


def _connection_lost() -> bool:
    """Whether the loop's database connection is gone, rather than a statement refused."""
    conn = connection.connection
    return conn is None or conn.closed or conn.broken


def _always(claim: Claim) -> bool:
    return True


def _batch_send(provider: BatchProvider, claims: list[Claim]) -> list[ProviderResult]:
    """A batch provider's answers; if it raises, every message of the batch failed
    temporarily (whether any was sent is unknown: the retries carry the same keys)."""
    try:
        return provider.send_batch([message_of(claim) for claim in claims])
    except Exception as exc:
        log.exception("provider %s raised for a batch of %d", provider.name, len(claims))
        error = TemporaryFailure(f"{provider.name} provider raised {type(exc).__name__}")
        return [error] * len(claims)
