"""The jitter both retry waits share (notifyqueue.backoff), and the two schedules built on it."""

from __future__ import annotations

import random

import pytest

from delivery.services import RetryPolicy
from notifyqueue.backoff import jittered
from webhooks.services import webhook_retry_wait_seconds


@pytest.mark.parametrize("r, factor", [(0.0, 0.9), (0.5, 1.0), (0.999999, 1.1)])
def test_jittered_scales_the_wait_by_a_factor_drawn_between_the_bounds(r, factor):
    assert jittered(100.0, low=0.9, high=1.1, rng=lambda: r) == pytest.approx(100.0 * factor)


def test_delivery_backoff_doubles_and_stays_in_d_to_2d_under_its_cap():
    policy = RetryPolicy(base_s=0.5, max_s=60)
    rng = random.Random(7)
    for attempt, d in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (5, 8.0)]:
        waits = [policy.delay_s(attempt, rng) for _ in range(200)]
        assert d <= min(waits) and max(waits) <= 2 * d
        assert max(waits) - min(waits) > d / 2  # spread, not one fixed value
    assert {policy.delay_s(20, rng) for _ in range(20)} == {60}


def test_webhook_waits_keep_their_fixed_schedule_with_the_same_jitter():
    schedule = [0, 5, 300, 1800]
    rng = random.Random(7)
    waits = [
        webhook_retry_wait_seconds(attempt=2, schedule=schedule, rng=rng.random) for _ in range(200)
    ]
    assert min(waits) >= 270 and max(waits) <= 330 and max(waits) - min(waits) > 30
