"""The webhook sender as `run_worker` runs it: a loop on its own thread.

It is separate from notification delivery on purpose: a slow or failing receiver holds only
this thread's POST slots (each POST is cut off at the webhook timeout), never a notification
slot. Slots are refilled as they free up, so a receiver that hangs delays only its own events.
"""

from __future__ import annotations

import logging
import threading
import time

from django.db import DatabaseError, close_old_connections, connection

from notifyqueue.outage import OutageLog
from webhooks.services import (
    WebhookBatch,
    WebhookDeliveries,
    webhook_events_reclaim_expired,
)

log = logging.getLogger("notifyqueue.webhooks")


class WebhookSender:
    def __init__(
        self, *, poll_interval_s: float, reclaim_interval_s: float, worker: str | None = None
    ) -> None:
        self.poll_interval_s = poll_interval_s
        # The worker whose heartbeat vouches for this sender's claims.
        self.worker = worker
        self.reclaim_interval_s = reclaim_interval_s
        self._next_reclaim = 0.0
        self._stop = threading.Event()
        self._drain = threading.Event()
        self._deliveries: WebhookDeliveries | None = None
        self._thread = threading.Thread(target=self._run, name="webhook-sender", daemon=True)

    def run_once(self, *, wait_s: float = 0.0) -> WebhookBatch:
        """Takes back the claims of dead workers and expired ones when it is time, records
        finished POSTs (waiting up to `wait_s` for one), and fills the free POST slots with
        due events."""
        if time.monotonic() >= self._next_reclaim:
            webhook_events_reclaim_expired()
            self._next_reclaim = time.monotonic() + self.reclaim_interval_s
        if self._deliveries is None:
            self._deliveries = WebhookDeliveries(worker=self.worker)
        return self._deliveries.step(wait_s=wait_s)

    def start(self) -> None:
        self._thread.start()

    def stop(self, *, drain: bool = False) -> None:
        """Stops claiming and finishes the POSTs in flight; with `drain`, only once nothing
        is due."""
        (self._drain if drain else self._stop).set()
        if not drain and self._deliveries is not None:
            # The events waiting for a POST slot are given back at once, not POSTed first.
            self._deliveries.stop_starting()

    def join(self) -> None:
        self._thread.join()

    def _run(self) -> None:
        try:
            wait_s = 0.0
            outage = OutageLog(log, "webhook sender")
            while not self._stop.is_set():
                close_old_connections()
                try:
                    batch = self.run_once(wait_s=wait_s)
                except DatabaseError:
                    # The finished POSTs' results are kept for the next step (their futures are
                    # done, so that step would not wait): wait here, or a database that refuses
                    # at once is asked again at once.
                    outage.failed(self.poll_interval_s)
                    wait_s = 0.0
                    self._stop.wait(self.poll_interval_s)
                    continue
                outage.succeeded()
                in_flight = self._deliveries.in_flight if self._deliveries else 0
                if batch.claimed:
                    wait_s = 0.0
                    continue
                if self._drain.is_set() and not in_flight:
                    return
                if in_flight:
                    # Wake when a POST finishes (its slot can take the next event) or when
                    # new events may have become due.
                    wait_s = self.poll_interval_s
                else:
                    wait_s = 0.0
                    self._stop.wait(self.poll_interval_s)
        finally:
            if self._deliveries is not None:
                try:
                    self._deliveries.close()
                except DatabaseError:
                    log.exception("webhook results not recorded at shutdown; claims will expire")
            connection.close()
