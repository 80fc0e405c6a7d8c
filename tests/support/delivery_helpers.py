"""Helpers for delivery tests: a movable clock and a worker builder. (The loopback providers:
tests/support/http_servers.py.)"""

from __future__ import annotations

import random

from delivery.circuits.services import CircuitPolicy
from delivery.providers.in_app import InAppProvider
from delivery.providers.simulated import SimulatedProvider
from delivery.services import RetryPolicy, Router
from delivery.worker import Worker, WorkerConfig
from ratelimits.repositories import RateLimitRepository
from ratelimits.services import RateLimit
from tests.support.clock import DbClock

# The database's clock, moved by the test (see tests/support/clock.py).
FakeClock = DbClock


def simulated_providers(**kwargs) -> dict:
    simulated = SimulatedProvider(**kwargs)
    return {"email": simulated, "sms": simulated, "push": simulated, "in_app": InAppProvider()}


def worker_build(
    *,
    providers: dict | None = None,
    concurrency: int = 4,
    batch_size: int = 10,
    claim_timeout_s: float = 30.0,
    policy: RetryPolicy | None = None,
    worker_id: str | None = None,
    circuit: CircuitPolicy | None = None,
    rate_limit: RateLimit | None = None,
    send_timeout_s: float = 0.0,
    rate_limits: RateLimitRepository | None = None,
    router: Router | None = None,
    priority_aging_s: float = 300.0,
    receipt_channels: frozenset[str] = frozenset(),
) -> Worker:
    return Worker(
        providers=providers or simulated_providers(),
        config=WorkerConfig(
            concurrency=concurrency,
            batch_size=batch_size,
            claim_timeout_s=claim_timeout_s,
            poll_interval_s=0.05,
            heartbeat_s=0.2,
            circuit=circuit,
            rate_limit=rate_limit,
            send_timeout_s=send_timeout_s,
            priority_aging_s=priority_aging_s,
            receipt_channels=receipt_channels,
        ),
        policy=policy or RetryPolicy(base_s=0.5, max_s=60.0),
        rng=random.Random(7),
        worker_id=worker_id,
        rate_limits=rate_limits,
        router=router,
    )


def step_until_idle(worker: Worker) -> None:
    """Runs the worker at the clock's current time until nothing due is left."""
    for _ in range(1000):
        step = worker.run_once(wait_s=0.5)
        if not (step.claimed or step.finished or step.in_flight):
            return
    raise AssertionError("worker never went idle")
