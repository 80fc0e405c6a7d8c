"""The jitter both retry waits share.

The project has two retry schedules on purpose, and they stay two:
- a notification's delivery (delivery.services.RetryPolicy) backs off exponentially from a
  configurable base, capped, with the wait drawn from [d, 2d];
- a webhook event (webhooks.services.webhook_retry_wait_seconds) follows Standard Webhooks'
  fixed schedule (5 s, 5 min, 30 min, 2 h, 5 h, 10 h, ...), each step ±10%.
What they share is only this: a wait drawn uniformly between two bounds, so the retries of
many messages that failed in the same outage do not all arrive at the same instant.
"""

from __future__ import annotations

from collections.abc import Callable


def jittered(wait_s: float, *, low: float, high: float, rng: Callable[[], float]) -> float:
    """`wait_s` scaled by a factor drawn uniformly from [low, high] (`rng()` is in [0, 1))."""
    return wait_s * (low + (high - low) * rng())
