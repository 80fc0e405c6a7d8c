"""Start-up checks of the delivery settings (`manage.py check` and every command, `run_worker`
included, run them)."""

from __future__ import annotations

import math

from django.conf import settings
from django.core.checks import Error, register

# A worker is taken for dead only after missing this many heartbeats in a row (less one): a
# beat lost to a dropped connection, or late behind a slow statement, never kills it.
DEAD_AFTER_MIN_HEARTBEATS = 3


@register()
def worker_liveness_settings_check(app_configs, **kwargs) -> list[Error]:
    heartbeat_s = settings.NOTIFYQUEUE_HEARTBEAT_SECONDS
    dead_after_s = settings.NOTIFYQUEUE_WORKER_DEAD_AFTER_SECONDS
    errors = []
    if not heartbeat_s > 0:
        errors.append(
            Error(
                f"NOTIFYQUEUE_HEARTBEAT_SECONDS must be more than 0 (got {heartbeat_s!r}).",
                id="delivery.E001",
            )
        )
    elif not dead_after_s >= DEAD_AFTER_MIN_HEARTBEATS * heartbeat_s:
        errors.append(
            Error(
                f"NOTIFYQUEUE_WORKER_DEAD_AFTER_SECONDS ({dead_after_s:g}) must be at least "
                f"{DEAD_AFTER_MIN_HEARTBEATS} times NOTIFYQUEUE_HEARTBEAT_SECONDS "
                f"({heartbeat_s:g}): a live worker that misses a beat or two would be taken "
                "for dead and lose its claims.",
                id="delivery.E002",
            )
        )
    return errors


@register()
def priority_aging_check(app_configs, **kwargs) -> list[Error]:
    """NOTIFYQUEUE_PRIORITY_AGING_SECONDS is a period: 0 (aging off) or a finite positive
    number of seconds."""
    aging_s = settings.NOTIFYQUEUE_PRIORITY_AGING_SECONDS
    if math.isfinite(aging_s) and aging_s >= 0:
        return []
    return [
        Error(
            f"NOTIFYQUEUE_PRIORITY_AGING_SECONDS is {aging_s!r}: it must be 0 (aging off) or a "
            "positive number of seconds.",
            id="delivery.E003",
        )
    ]
