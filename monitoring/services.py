"""How long a worker stays alive without a heartbeat: the window every app that reports on
workers agrees on (the health checks, the admin's worker list, the queue gauges)."""

from __future__ import annotations

from django.conf import settings

# A worker heartbeats every NOTIFYQUEUE_HEARTBEAT_SECONDS; missing this many in a row means it
# is gone (crashed, hung, or its host is down).
HEARTBEATS_MISSED_BEFORE_DEAD = 3


def worker_live_window_s() -> float:
    return HEARTBEATS_MISSED_BEFORE_DEAD * settings.NOTIFYQUEUE_HEARTBEAT_SECONDS
