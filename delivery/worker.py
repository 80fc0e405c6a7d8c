"""The delivery worker: claims due notifications, delivers them, records the results.

`Worker.run_once()` is one step (collect finished deliveries, record them in one statement,
claim as many rows as there are free delivery slots) and returns what it did; `Worker.run()`
wraps it in a loop with heartbeats, reclaiming of expired claims, and LISTEN/NOTIFY wake-ups.
Deliveries run on `concurrency` threads, so that many provider calls are in flight at once; no
database lock is held during any of them.

A worker never holds more claims than it has free slots: a claimed row starts at once, so a
CRITICAL created now is the next row claimed, and no claim's timer runs out in a local queue.
Every decision about time is the database's (see notifyqueue_now()); the worker's own clock
only measures how long it has held a claim (time.monotonic()).
"""

from __future__ import annotations

import logging
import os
import queue
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import psycopg
from django.db import DatabaseError, connection

from delivery.circuits.services import Circuit, CircuitPolicy, Refused, circuits_register
from delivery.providers.base import Message, Provider, ProviderResult, TemporaryFailure
from delivery.repositories import Claim, DeliveryRepository, Finish, Finished
from delivery.services import RetryPolicy, Router, attempt_finish, claim_recheck, claim_release
from monitoring.metrics import DELIVERY as metrics
from preferences.routing import PreferenceRouter
from ratelimits.repositories import Admitted, Deferred, RateLimitRepository
from ratelimits.services import RateLimit, recipient_admit

log = logging.getLogger("notifyqueue.delivery")

WAKEUP_CHANNEL = "notifyqueue_due"


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
    batch_size: int = 100
    claim_timeout_s: float = 300.0
    # The longest a provider call may take (NOTIFYQUEUE_PROVIDER_TIMEOUT_SECONDS): a send is
    # started only while at least this much of its claim is left.
    send_timeout_s: float = 0.0
    poll_interval_s: float = 1.0
    heartbeat_s: float = 5.0
    # None switches the per-recipient limit off (tests of other behaviour use this).
    rate_limit: RateLimit | None = None
    # None switches the per-provider circuit breakers off (likewise).
    circuit: CircuitPolicy | None = None


def connection_release() -> None:
    """Gives this thread's database connection back to the worker's pool (run_worker uses
    one), so threads hold a connection only while they use it; without a pool, keeps it."""
    if connection.settings_dict["OPTIONS"].get("pool"):
        connection.close()


class DeliveryPool:
    """`size` threads that each deliver one claim at a time, fed from a queue."""

    def __init__(self, size: int, deliver: Callable[[Claim], Finish | None]) -> None:
        self._deliver = deliver
        self._tasks: queue.Queue[Claim | None] = queue.Queue()
        # None: the delivery already settled its row itself (a rate-limit deferral).
        self._done: queue.Queue[Finish | None] = queue.Queue()
        self.outstanding = 0
        self._threads = [
            threading.Thread(target=self._run, name=f"delivery-{i}", daemon=True)
            for i in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, claims: Iterable[Claim]) -> None:
        for claim in claims:
            self.outstanding += 1
            self._tasks.put(claim)

    def results(self, wait_s: float = 0.0) -> list[Finish]:
        """Finished deliveries; waits up to `wait_s` for the first one when none is ready."""
        done: list[Finish | None] = []
        try:
            if wait_s > 0 and self.outstanding:
                done.append(self._done.get(timeout=wait_s))
            while True:
                done.append(self._done.get_nowait())
        except queue.Empty:
            pass
        self.outstanding -= len(done)
        return [finish for finish in done if finish is not None]

    def unstarted(self) -> list[Claim]:
        """Takes back every claim no thread has picked up yet."""
        claims: list[Claim] = []
        try:
            while True:
                claim = self._tasks.get_nowait()
                if claim is not None:
                    claims.append(claim)
        except queue.Empty:
            pass
        self.outstanding -= len(claims)
        return claims

    def close(self) -> None:
        for _ in self._threads:
            self._tasks.put(None)
        for thread in self._threads:
            thread.join()

    def _run(self) -> None:
        try:
            while (claim := self._tasks.get()) is not None:
                finish = self._deliver(claim)
                self._done.put(finish)
                connection_release()
                if connection.errors_occurred:
                    connection.close_if_unusable_or_obsolete()
        finally:
            connection.close()


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
    ) -> None:
        self.providers = providers
        self.config = config
        self.policy = policy
        self.worker_id = worker_id or worker_id_new()
        self.repository = repository or DeliveryRepository()
        self.rng = rng or random.Random()
        self.rate_limits = RateLimitRepository()
        self.router = router or PreferenceRouter()
        # In-app delivery is a row in our own database: there is no provider to isolate.
        self.circuits = {
            channel: Circuit(f"{channel}:{provider.name}", config.circuit)
            for channel, provider in providers.items()
            if config.circuit and channel != "in_app"
        }
        self.delivered = 0
        self._unrecorded: list[Finish] = []
        self._next_maintenance = 0.0
        self._stopping = threading.Event()
        self._pool = DeliveryPool(config.concurrency, self._deliver_guarded)

    # --- one step -------------------------------------------------------------------------

    def run_once(self, *, wait_s: float = 0.0) -> StepResult:
        """Records what finished (waiting up to `wait_s` for it), then claims as many rows as
        there are free delivery slots (at most batch_size), unless the worker is stopping."""
        finished = self._record(self._pool.results(wait_s))
        claimed = 0
        free = min(self.config.batch_size, self.config.concurrency - self._pool.outstanding)
        if not self._stopping.is_set() and free > 0:
            claimed_at = time.monotonic()
            claims = self.repository.notification_claim_due(
                worker=self.worker_id,
                limit=free,
                claim_timeout_s=self.config.claim_timeout_s,
            )
            start_by = claimed_at + self.config.claim_timeout_s - self.config.send_timeout_s
            self._pool.submit(replace(claim, start_by=start_by) for claim in claims)
            claimed = len(claims)
        return StepResult(claimed=claimed, finished=finished, in_flight=self._pool.outstanding)

    def reclaim_expired(self) -> int:
        """Returns expired claims of dead or stalled workers to the queue."""
        reclaimed = self.repository.notification_reclaim_expired()
        if self.config.rate_limit:
            self.rate_limits.ratelimit_prune(window_s=self.config.rate_limit.window_s)
        for row in reclaimed:
            log.warning(
                "claim expired notification=%s status=%s worker=%s",
                row.id,
                row.status,
                self.worker_id,
            )
        return len(reclaimed)

    def heartbeat(self) -> None:
        self.repository.worker_heartbeat(
            worker=self.worker_id,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            delivered=self.delivered,
        )

    # --- the loop -------------------------------------------------------------------------

    def stop(self) -> None:
        """Asks the loop to stop claiming; safe to call from a signal handler."""
        self._stopping.set()

    def run(self, *, until_empty: bool = False) -> None:
        """Runs until `stop()` (or, with `until_empty`, until nothing is due or in flight);
        then gives back unstarted claims, finishes in-flight deliveries and returns. A lost
        database connection is logged and retried, never fatal."""
        listener = WakeupListener()
        self._next_maintenance = 0.0
        circuits_register(list(self.circuits.values()))
        try:
            while not self._stopping.is_set():
                try:
                    if not self._loop_once(listener, until_empty=until_empty):
                        break
                except DatabaseError:
                    log.exception(
                        "database error worker=%s; retrying in %.1fs",
                        self.worker_id,
                        self.config.poll_interval_s,
                    )
                    connection.close()
                    self._stopping.wait(self.config.poll_interval_s)
        finally:
            self._shutdown()
            listener.close()

    def _loop_once(self, listener: WakeupListener, *, until_empty: bool) -> bool:
        """One turn of the loop; False once `until_empty` finds nothing left to do."""
        if time.monotonic() >= self._next_maintenance:
            self.heartbeat()
            self.reclaim_expired()
            self._next_maintenance = time.monotonic() + self.config.heartbeat_s
        step = self.run_once()
        if step.claimed or step.finished:
            return True
        if step.in_flight:
            self._record(self._pool.results(wait_s=0.05))
            return True
        if until_empty and not self._unrecorded and not self.reclaim_expired():
            return False
        listener.wait(self._idle_wait_s(), interrupt=self._stopping)
        return True

    def _idle_wait_s(self) -> float:
        """Sleeps until the next row is due, but never longer than the poll interval, so a
        lost wake-up costs at most one interval."""
        until_due = self.repository.notification_next_due_in()
        if until_due is None:
            return self.config.poll_interval_s
        return max(0.0, min(until_due, self.config.poll_interval_s))

    def _shutdown(self) -> None:
        released = [claim_release(claim) for claim in self._pool.unstarted()]
        try:
            self._record(released)  # at once: another worker may take them meanwhile
            while self._pool.outstanding:
                self._record(self._pool.results(wait_s=0.1))
            self.repository.worker_stopped(worker=self.worker_id, delivered=self.delivered)
        except DatabaseError:
            # The claims stay PROCESSING until they expire; another worker then re-sends them
            # with the same idempotency keys, so nothing is lost or sent twice.
            log.exception(
                "could not record %d results at shutdown worker=%s",
                len(self._unrecorded),
                self.worker_id,
            )
        finally:
            self._pool.close()
        if released:
            log.info("released %d unstarted claims worker=%s", len(released), self.worker_id)

    # --- delivery (runs on pool threads) ---------------------------------------------------

    def _deliver_guarded(self, claim: Claim) -> Finish | None:
        """`_deliver`, but an unexpected error still ends the claim: a failed attempt, retried
        after its backoff under the same idempotency key (whether it was sent is unknown), so
        the row never waits out its claim timeout."""
        try:
            return self._deliver(claim)
        except Exception as exc:
            log.exception("delivery of notification=%s failed", claim.id)
            return attempt_finish(
                claim,
                TemporaryFailure(f"worker error {type(exc).__name__}"),
                policy=self.policy,
                rng=self.rng,
            )

    def _deliver(self, claim: Claim) -> Finish | None:
        """One claim, start to finish: the send-time checks, then the provider. Returns the
        result to record, or None when the row was settled here (a rate-limit deferral)."""
        started = time.monotonic()
        try:
            ready = self._prepare(claim)
        except DatabaseError as exc:
            # Nothing was sent. A failed attempt, not a release: it backs off, and a row that
            # breaks the checks every time runs out of attempts instead of looping.
            log.exception("send-time checks failed notification=%s", claim.id)
            ready, result = (
                claim,
                TemporaryFailure(f"send-time checks failed: {type(exc).__name__}"),
            )
        else:
            if not isinstance(ready, Claim):
                return ready
            if time.monotonic() >= claim.start_by:
                # Too little of the claim is left for the provider to answer before another
                # worker may take it over: give it back unsent, its attempt returned.
                log.warning(
                    "claim too old to start notification=%s worker=%s; released",
                    claim.id,
                    self.worker_id,
                )
                return claim_release(claim)
            result = self._send(ready)
        try:
            finish = attempt_finish(
                ready, result, policy=self.policy, rng=self.rng, router=self.router
            )
        except Exception:
            # The fallback look-up failed after the provider answered: the answer is still
            # recorded, as if no fallback were left.
            log.exception("fallback look-up failed notification=%s", claim.id)
            finish = attempt_finish(ready, result, policy=self.policy, rng=self.rng)
        try:
            metrics.attempt_finished(ready, finish, duration_s=time.monotonic() - started)
        except Exception:
            log.exception("attempt metrics not updated notification=%s", claim.id)
        log.info(
            "attempt finished notification=%s client=%s channel=%s attempt=%d outcome=%s "
            "status=%s worker=%s",
            ready.id,
            ready.client_id,
            ready.channel,
            ready.attempt_count,
            finish.outcome,
            finish.status,
            self.worker_id,
        )
        return finish

    def _prepare(self, claim: Claim) -> Claim | Finish | None:
        """The user's preferences, then the recipient's rate limit. Returns the claim to send
        (possibly switched to a fallback channel), a Finish that ends it without sending, or
        None when the rate limit deferred it."""
        if claim.user_id is not None:
            rechecked = claim_recheck(claim, router=self.router)
            if isinstance(rechecked, Finish):
                log.info(
                    "preferences changed notification=%s client=%s channel=%s status=%s "
                    "next_channel=%s worker=%s",
                    claim.id,
                    claim.client_id,
                    claim.channel,
                    rechecked.status,
                    rechecked.channel,
                    self.worker_id,
                )
                return rechecked
            claim = rechecked
        if self.config.rate_limit:
            admission = recipient_admit(
                claim, rate_limit=self.config.rate_limit, repository=self.rate_limits
            )
            if not isinstance(admission, Admitted):
                if isinstance(admission, Deferred):
                    metrics.rate_limit_deferred(channel=claim.channel)
                    log.info(
                        "rate limited notification=%s client=%s channel=%s attempt=%d "
                        "outcome=RATE_LIMITED status=PENDING due_at=%s worker=%s",
                        claim.id,
                        claim.client_id,
                        claim.channel,
                        claim.attempt_count,
                        admission.due_at.isoformat(),
                        self.worker_id,
                    )
                return None
        return claim

    def _send(self, claim: Claim) -> ProviderResult:
        """The provider's answer, through the provider's circuit breaker: while the circuit
        is open the provider is not called and the answer is a TemporaryFailure."""
        circuit = self.circuits.get(claim.channel)
        try:
            admission = circuit.admit() if circuit else None
        except DatabaseError:
            # The breaker is an optimisation; without its state, call the provider.
            log.exception("circuit %s unreadable; calling the provider", circuit.name)
            circuit, admission = None, None
        if isinstance(admission, Refused):
            return TemporaryFailure(admission.reason)
        provider = self.providers[claim.channel]
        message = Message(
            notification_id=claim.id,
            channel=claim.channel,
            recipient=claim.recipient,
            subject=claim.subject,
            body=claim.body,
            metadata=claim.metadata,
        )
        connection_release()  # no connection is held while the provider answers
        try:
            result = provider.send(message)
        except Exception as exc:  # a provider bug must not lose the claim's result
            log.exception("provider %s raised for notification=%s", provider.name, claim.id)
            result = TemporaryFailure(f"{provider.name} provider raised {type(exc).__name__}")
        if circuit:
            try:
                circuit.record(admission, result)
            except DatabaseError:
                log.exception("circuit %s not updated after a send", circuit.name)
        return result

    def _record(self, finishes: list[Finish]) -> int:
        """Applies results in one statement (row by row if that fails; see
        `notification_finish`). If the database is unreachable they are kept and applied with
        the next batch."""
        finishes, self._unrecorded = self._unrecorded + finishes, []
        if not finishes:
            return 0
        try:
            finished = self.repository.notification_finish(finishes)
        except DatabaseError:
            self._unrecorded = finishes
            raise
        applied = {row.id: row.status for row in finished}
        self._release_freed_slots(finished)
        try:
            metrics.results_recorded(finishes, applied)
        except Exception:
            log.exception("result metrics not updated")
        for finish in finishes:
            if finish.id not in applied:
                log.warning(
                    "stale result ignored notification=%s outcome=%s worker=%s "
                    "(claim expired and was taken over)",
                    finish.id,
                    finish.outcome,
                    self.worker_id,
                )
        self.delivered += sum(1 for row in finished if row.status == "SENT")
        return len(applied)

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


class WakeupListener:
    """LISTENs on its own connection for `NOTIFY notifyqueue_due` (sent by a trigger when a
    notification is inserted or put back to PENDING). Falls back to sleeping if the
    connection fails; the poll interval then bounds the delay."""

    def __init__(self) -> None:
        self._conn: psycopg.Connection | None = None

    def wait(self, timeout_s: float, *, interrupt: threading.Event) -> bool:
        """Blocks until a wake-up, `timeout_s`, or `interrupt`; True when woken."""
        deadline = time.monotonic() + timeout_s
        try:
            conn = self._connect()
            while (remaining := deadline - time.monotonic()) > 0 and not interrupt.is_set():
                # Short slices keep a stop request (SIGTERM) from waiting out a long sleep.
                if any(True for _ in conn.notifies(timeout=min(remaining, 0.2), stop_after=1)):
                    list(conn.notifies(timeout=0))  # several inserts wake the worker once
                    return True
            return False
        except psycopg.Error:
            log.warning("wake-up listener lost its connection; polling until it is back")
            self.close()
            interrupt.wait(timeout_s)
            return False

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _connect(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            params = connection.get_connection_params()
            params = {
                key: value
                for key, value in params.items()
                if key not in {"cursor_factory", "context", "prepare_threshold"}
            }
            self._conn = psycopg.connect(**params, autocommit=True)
            self._conn.execute(f"LISTEN {WAKEUP_CHANNEL}")
        return self._conn
