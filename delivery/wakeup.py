"""The worker's wake-up: a LISTEN connection on its own thread.

A trigger sends `NOTIFY notifyqueue_due` when a notification is inserted or put back to
PENDING (`notification_wakeup`). The listener tells the worker of each one, so an idle
worker claims at once instead of at its next poll. It is the only session state the
worker relies on, so it has its own direct connection (NOTIFYQUEUE_LISTEN_DATABASE_URL when
the others go through a transaction-pooling PgBouncer, where LISTEN does not work); if that
connection fails, the worker falls back to polling until it is back.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import psycopg
from django.conf import settings
from django.db import connection

log = logging.getLogger("notifyqueue.delivery")

WAKEUP_CHANNEL = "notifyqueue_due"


class WakeupListener:
    def __init__(self, notify: Callable[[], None], *, retry_s: float) -> None:
        self._notify = notify
        self._retry_s = retry_s
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wakeup-listener", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._closed.set()
        self._thread.join()

    def _run(self) -> None:
        conn: psycopg.Connection | None = None
        lost = False
        while not self._closed.is_set():
            try:
                if conn is None:
                    conn = _connect()
                    if lost:
                        log.warning("wake-up listener reconnected")
                        lost = False
                    self._notify()  # whatever was inserted while it was away
                # Half-second slices, so close() never waits long.
                for _ in conn.notifies(timeout=0.5):
                    self._notify()
            except psycopg.Error:
                if not lost:
                    log.warning("wake-up listener lost its connection; polling until it is back")
                    lost = True
                if conn is not None:
                    conn.close()
                    conn = None
                self._closed.wait(self._retry_s)
        if conn is not None:
            conn.close()


def _connect() -> psycopg.Connection:
    url = settings.NOTIFYQUEUE_LISTEN_DATABASE_URL
    if url:
        conn = psycopg.connect(url, autocommit=True)
    else:
        params = {
            key: value
            for key, value in connection.get_connection_params().items()
            if key not in {"cursor_factory", "context", "prepare_threshold"}
        }
        conn = psycopg.connect(**params, autocommit=True)
    conn.execute(f"LISTEN {WAKEUP_CHANNEL}")
    return conn
