"""Provider calls in flight: a thread pool that only sends, and the claims waiting for it.

The worker's loop does every database read and write; these threads only call providers (an
HTTP request, an SMTP conversation) and never touch the database, so a worker's connections
do not grow with its concurrency. A finished call starts the next waiting claim and wakes the
loop, which records it.
"""

from __future__ import annotations

import itertools
import logging
import math
import queue
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from django.db import connection

from delivery.circuits.services import Allowed
from delivery.providers.base import Message, Provider, ProviderResult, TemporaryFailure
from delivery.repositories import Claim
from delivery.unsubscribe.services import unsubscribe_headers
from notifyqueue.vocabulary import Priority

log = logging.getLogger("notifyqueue.delivery")
# How many frames a provider's unexpected exception is logged with.
RAISED_FRAMES = 5
# The weight of each call's duration in the moving average that sizes the claims held ready
# (Sends.ready_size), and of each turn of the loop in the worker's (delivery/worker.py).
CALL_WEIGHT = 0.1


@dataclass(frozen=True)
class Sent:
    """A provider's answer to one claim, and what the loop needs to record it."""

    claim: Claim
    # The circuit's admission of the call (None: no circuit), which the answer reports to.
    admission: Allowed | None
    result: ProviderResult
    # time.monotonic() when the loop started on the claim.
    started: float


def message_of(claim: Claim) -> Message:
    return Message(
        notification_id=claim.id,
        channel=claim.channel,
        recipient=claim.recipient,
        subject=claim.subject,
        body=claim.body,
        metadata=claim.metadata,
        headers=unsubscribe_headers(
            client_id=claim.client_id,
            channel=claim.channel,
            priority=claim.priority,
            recipient=claim.recipient,
            user_id=claim.user_id,
            template=claim.template,
        ),
    )


def provider_call(provider: Provider, message: Message) -> ProviderResult:
    """The provider's answer; a provider that raises has failed temporarily (whether it sent
    is unknown, so the retry carries the same idempotency key)."""
    try:
        return provider.send(message)
    except Exception as exc:
        # An exception's text may quote the message (an address, a subject), which is never
        # logged: the log names its class and where it was raised.
        log.error(
            "provider %s raised %s for notification=%s at %s",
            provider.name,
            type(exc).__name__,
            message.notification_id,
            raised_where(exc),
        )
        return TemporaryFailure(f"{provider.name} provider raised {type(exc).__name__}")
    finally:
        if connection.connection is not None:
            # A provider that used the database on this thread (no built-in one does) does
            # not keep a connection open per send thread.
            connection.close()


def raised_where(exc: BaseException) -> str:
    """The innermost frames an exception passed through, as `file:line function`."""
    frames = traceback.extract_tb(exc.__traceback__)[-RAISED_FRAMES:]
    return " < ".join(f"{f.filename}:{f.lineno} {f.name}" for f in reversed(frames))


@dataclass(frozen=True)
class _Call:
    provider: Provider
    claim: Claim
    admission: Allowed | None
    started: float
    # time.monotonic() after which the call must not start (its claim could expire first).
    start_by: float
    # time.monotonic() before the claim statement that made the claim (see `holds`).
    claimed_at: float


class Sends:
    """Provider calls: at most `concurrency` at once on a ThreadPoolExecutor, and up to
    `waiting` more claims held ready: CRITICAL first, then the claims of the clients with the
    fewest calls running, in claim order. How many are held ready is sized to the provider
    (`ready_size`): about as many as slots free while the loop makes one turn, so a claim
    waits there about that long and a client whose rows arrive later is not held behind
    claims made long before them.

    A call that ends starts the next waiting one from its own thread (the future's done
    callback), so a slow provider's slots refill without waiting for the loop's next claim
    statement; the loop keeps the waiting claims topped up. A waiting claim that could no
    longer be sent before its claim expires, or that another worker may have taken over (the
    worker's heartbeat lapsed since it was claimed), is not started: `withdrawn` hands it
    back to the loop, which releases it (attempt returned), as it does every waiting claim
    when the worker stops. `collect` hands back the answers that are in; each answer sets `wake`.
    """

    def __init__(
        self,
        concurrency: int,
        wake: threading.Event,
        *,
        waiting: int = 0,
        stopping: threading.Event | None = None,
        holds: Callable[[float], bool] | None = None,
    ) -> None:
        self.concurrency = concurrency
        # The most claims held ready, and how many are now (`ready_size`): all of them until
        # a call has been timed.
        self.waiting = waiting
        self.ready = waiting
        # The provider calls' duration, a moving average (None until a call ends).
        self.call_s: float | None = None
        self._wake = wake
        # Once set, an ending call starts no waiting one: they are withdrawn (see withdrawn).
        self._stopping = stopping or threading.Event()
        # Whether a claim made at a time (its `claimed_at`) is surely still the worker's
        # (delivery.upkeep.Heartbeat.holds); one that may have been taken over is withdrawn.
        self._holds = holds or (lambda claimed_at: True)
        self._executor = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="send")
        self._done: queue.SimpleQueue[Sent] = queue.SimpleQueue()
        self._running: dict[Future[ProviderResult], _Call] = {}
        # time.monotonic() when each running call started.
        self._began: dict[Future[ProviderResult], float] = {}
        # Claims waiting for a slot: (0 for CRITICAL else 1, arrival, call); see `_following`.
        self._queued: list[tuple[int, int, _Call]] = []
        self._withdrawn: list[Claim] = []
        self._arrivals = itertools.count()
        self._lock = threading.Lock()

    @property
    def outstanding(self) -> int:
        """Calls submitted (running or waiting) and not yet collected or withdrawn."""
        with self._lock:
            return (
                len(self._running) + len(self._queued) + len(self._withdrawn) + self._done.qsize()
            )

    def held(self) -> dict[uuid.UUID, int]:
        """Claims submitted and not yet answered (running or waiting), by client: the claim
        counts each client's turns from these."""
        with self._lock:
            calls = [*self._running.values(), *(call for _, _, call in self._queued)]
        return dict(Counter(call.claim.client_id for call in calls))

    @property
    def idle(self) -> int:
        """Send threads free now. Until the caller's next submit this can only grow: a
        finishing call starts a waiting one only while some wait, and then none is idle."""
        with self._lock:
            return 0 if self._queued else self.concurrency - len(self._running)

    @property
    def free(self) -> int:
        """How many more claims may be submitted now."""
        return self.concurrency + self.ready - self.outstanding

    def ready_size(self, turnaround_s: float | None) -> int:
        """Sets and returns how many claims to hold ready: as many as send slots free, on
        average, while the loop turns once (`turnaround_s`: a step that claims, its results
        recorded), rounded up, so a freed slot seldom waits for the loop (only when more
        than that free in one turn, and then for the rest of it); at least one, at most
        `waiting`, and all `waiting` until a call and a turn have been timed. A slow
        provider's calls end seldom: one claim ready is enough, and the others are claimed
        when their slot frees, in the turns of that moment. (With 8 slots on a provider
        taking 1 s and a loop turning in 20 ms: 1; with 50 slots, 50 ms calls and the same
        loop: 20.)"""
        call_s = self.call_s
        if call_s is None or turnaround_s is None or self.waiting == 0:
            self.ready = self.waiting
        else:
            slots = self.concurrency * max(turnaround_s, 0.0) / max(call_s, 1e-6)
            self.ready = max(1, min(self.waiting, math.ceil(slots)))
        return self.ready

    def submit(
        self,
        provider: Provider,
        claim: Claim,
        admission: Allowed | None,
        started: float,
        *,
        start_by: float = float("inf"),
        claimed_at: float = float("-inf"),
    ) -> None:
        """Starts the call, or queues it when every thread is busy (at most `waiting` are
        meant to be: the loop submits at most `free`)."""
        call = _Call(provider, claim, admission, started, start_by, claimed_at)
        with self._lock:
            if len(self._running) >= self.concurrency:
                tier = int(claim.priority != Priority.CRITICAL)
                self._queued.append((tier, next(self._arrivals), call))
                return
            future = self._start(call)
        future.add_done_callback(self._finished)

    def collect(self, wait_s: float = 0.0) -> list[Sent]:
        """The answers that are in; waits up to `wait_s` for one when none is but some are
        still out."""
        if wait_s > 0 and self._done.empty() and self.outstanding:
            deadline = time.monotonic() + wait_s
            while self._done.empty() and (left := deadline - time.monotonic()) > 0:
                self._wake.wait(left)
                self._wake.clear()
        collected = []
        while True:
            try:
                collected.append(self._done.get_nowait())
            except queue.Empty:
                return collected

    def withdrawn(self, *, everything: bool = False) -> list[Claim]:
        """Waiting claims that must not start: too late to (see `start_by`), or, with
        `everything`, all that are waiting (the worker is stopping)."""
        with self._lock:
            if everything:
                self._withdrawn += [call.claim for _, _, call in self._queued]
                self._queued.clear()
            withdrawn, self._withdrawn = self._withdrawn, []
        return withdrawn

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    def _start(self, call: _Call) -> Future[ProviderResult]:
        """Submits the call; the caller holds the lock and adds the done callback after
        releasing it (a future already done runs its callback at once, in that thread)."""
        future = self._executor.submit(provider_call, call.provider, message_of(call.claim))
        self._running[future] = call
        self._began[future] = time.monotonic()
        return future

    def _following(self) -> _Call:
        """Takes the waiting claim to start next (the caller holds the lock): a CRITICAL first;
        then the one whose client has the fewest calls running here, so a client that was
        claimed for while another's rows filled every slot does not wait behind those claimed
        just before it; then the earliest claimed, which keeps the claims' order (each
        client's own rows by priority). At most `waiting` are compared."""
        running = Counter(call.claim.client_id for call in self._running.values())
        place = min(
            range(len(self._queued)),
            key=lambda i: (
                self._queued[i][0],
                running[self._queued[i][2].claim.client_id],
                self._queued[i][1],
            ),
        )
        return self._queued.pop(place)[2]

    def _finished(self, future: Future[ProviderResult]) -> None:
        following = None
        with self._lock:
            call = self._running.pop(future)
            # provider_call never raises, and nothing is cancelled: close() waits for all.
            self._done.put(Sent(call.claim, call.admission, future.result(), call.started))
            now = time.monotonic()
            took = now - self._began.pop(future)
            self.call_s = (
                took if self.call_s is None else self.call_s + CALL_WEIGHT * (took - self.call_s)
            )
            while self._queued and following is None and not self._stopping.is_set():
                waiting = self._following()
                if now < waiting.start_by and self._holds(waiting.claimed_at):
                    following = self._start(waiting)
                else:
                    self._withdrawn.append(waiting.claim)
        if following is not None:
            following.add_done_callback(self._finished)
        self._wake.set()
