"""The webhook sender as `run_worker` runs it: a loop on its own thread.

It is separate from notification delivery on purpose: a slow or failing receiver holds only
this thread (each POST is cut off at the webhook timeout), never a notification slot.
"""

from __future__ import annotations

import logging
import threading
import time

from django.db import DatabaseError, close_old_connections, connection

from webhooks.services import (
    WebhookBatch,
    webhook_events_deliver_due,
    webhook_events_reclaim_expired,
)

log = logging.getLogger("notifyqueue.webhooks")


class WebhookSender:
    def __init__(self, *, poll_interval_s: float, reclaim_interval_s: float) -> None:
        self.poll_interval_s = poll_interval_s
        self.reclaim_interval_s = reclaim_interval_s
        self._next_reclaim = 0.0
        self._stop = threading.Event()
        self._drain = threading.Event()
        self._thread = threading.Thread(target=self._run, name="webhook-sender", daemon=True)

    def run_once(self) -> WebhookBatch:
        """Reclaims expired claims when it is time, then delivers one batch of due events."""
        if time.monotonic() >= self._next_reclaim:
            webhook_events_reclaim_expired()
            self._next_reclaim = time.monotonic() + self.reclaim_interval_s
        return webhook_events_deliver_due()

    def start(self) -> None:
        self._thread.start()

    def stop(self, *, drain: bool = False) -> None:
        """Stops after the batch in hand; with `drain`, only once nothing is due."""
        (self._drain if drain else self._stop).set()

    def join(self) -> None:
        self._thread.join()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                close_old_connections()
                try:
                    batch = self.run_once()
                except DatabaseError:
                    log.exception("webhook sender step failed; retrying after the poll interval")
                    batch = WebhookBatch()
                if batch.claimed:
                    continue
                if self._drain.is_set():
                    return
                self._stop.wait(self.poll_interval_s)
        finally:
            connection.close()
