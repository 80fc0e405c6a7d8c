"""How long a worker stays alive without a heartbeat: the window every app that reports on
workers agrees on (the takeover of a dead worker's claims, the health checks, the admin's
worker list, the queue gauges)."""

from __future__ import annotations

from django.conf import settings


def worker_live_window_s() -> float:
    """NOTIFYQUEUE_WORKER_DEAD_AFTER_SECONDS: a worker whose heartbeat is older is dead, and
    its claims are taken over (delivery/sql/functions/worker_dead.sql)."""
    return settings.NOTIFYQUEUE_WORKER_DEAD_AFTER_SECONDS
