"""Start-up checks of the delivery settings (`manage.py check` and every command, `run_worker`
included, run them)."""

from __future__ import annotations

import math

from django.conf import settings
from django.core.checks import Error, register


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
            id="delivery.E001",
        )
    ]
