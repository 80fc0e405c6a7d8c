"""Provider calls in flight: a thread pool that only sends.

The worker's loop does every database read and write; these threads only call providers (an
HTTP request, an SMTP conversation) and never touch the database, so a worker's connections
do not grow with its concurrency. A finished call wakes the loop, which records it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from django.db import connection

from delivery.circuits.services import Allowed
from delivery.providers.base import Message, Provider, ProviderResult, TemporaryFailure
from delivery.repositories import Claim

log = logging.getLogger("notifyqueue.delivery")


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
    )


def provider_call(provider: Provider, message: Message) -> ProviderResult:
    """The provider's answer; a provider that raises has failed temporarily (whether it sent
    is unknown, so the retry carries the same idempotency key)."""
    try:
        return provider.send(message)
    except Exception as exc:
        log.exception(
            "provider %s raised for notification=%s", provider.name, message.notification_id
        )
        return TemporaryFailure(f"{provider.name} provider raised {type(exc).__name__}")
    finally:
        if connection.connection is not None:
            # A provider that used the database on this thread (no built-in one does) does
            # not keep a connection open per send thread.
            connection.close()


class Sends:
    """At most `concurrency` provider calls at once on a ThreadPoolExecutor. The loop submits
    a call only for a free slot, so a call never waits in a local queue; `collect` hands back
    the answers that are in, and each answer sets `wake`."""

    def __init__(self, concurrency: int, wake: threading.Event) -> None:
        self.concurrency = concurrency
        self._wake = wake
        self._executor = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="send")
        self._done: queue.SimpleQueue[Sent] = queue.SimpleQueue()
        self._running: dict[Future[ProviderResult], tuple[Claim, Allowed | None, float]] = {}
        self._lock = threading.Lock()

    @property
    def outstanding(self) -> int:
        """Calls submitted and not yet collected."""
        with self._lock:
            return len(self._running) + self._done.qsize()

    @property
    def free(self) -> int:
        return self.concurrency - self.outstanding

    def submit(
        self, provider: Provider, claim: Claim, admission: Allowed | None, started: float
    ) -> None:
        with self._lock:
            future = self._executor.submit(provider_call, provider, message_of(claim))
            self._running[future] = (claim, admission, started)
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

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    def _finished(self, future: Future[ProviderResult]) -> None:
        with self._lock:
            claim, admission, started = self._running.pop(future)
            # provider_call never raises, and nothing is cancelled: close() waits for all.
            self._done.put(Sent(claim, admission, future.result(), started))
        self._wake.set()
