"""A provider that is down for two minutes while notifications keep arriving: its circuit
opens, what arrives meanwhile is held without using attempts, and after the provider
recovers every notification is sent exactly once; none is lost or dead-lettered."""

from __future__ import annotations

import time

import pytest

from delivery.circuits.models import CircuitBreaker, CircuitState
from notifications.models import Notification, Status
from tests.faults.harness import Workers, all_final, universal_check, wait_until
from tests.support.factories import ClientFactory, NotificationFactory
from tests.support.http_servers import ScriptedProvider

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

OUTAGE_S = 120.0
# The circuit as in production (five failures in a row open it), with a cooldown short enough
# that the outage sees dozens of probes: each a real call that fails, spread over the held
# rows rather than spent from one row's attempts.
CIRCUIT_ENV = {
    "NOTIFYQUEUE_CIRCUIT_FAILURE_THRESHOLD": "5",
    "NOTIFYQUEUE_CIRCUIT_COOLDOWN_SECONDS": "3",
}
# Recipients shared by several notifications, each fewer than the rate limit's 10 an hour.
RECIPIENTS = 60


def test_a_provider_down_for_two_minutes_loses_nothing_and_sends_each_once_after(
    database_url, client, webhooks
):
    other = ClientFactory(webhook_url=webhooks.url)
    created: list[Notification] = []

    def arrive(count: int) -> None:
        for _ in range(count):
            owner = (client, other)[len(created) % 2]
            created.append(
                NotificationFactory(
                    client=owner,
                    recipient=f"r{len(created) % RECIPIENTS}@example.com",
                    max_attempts=6,
                )
            )

    with (
        ScriptedProvider(down=True) as provider,
        Workers(database_url, provider.url, **CIRCUIT_ENV) as workers,
    ):
        workers.start()
        workers.start()
        outage_ends = time.monotonic() + OUTAGE_S
        opened = False
        while time.monotonic() < outage_ends:
            arrive(2)
            opened = (
                opened
                or CircuitBreaker.objects.filter(
                    name="email:http", state=CircuitState.OPEN
                ).exists()
            )
            time.sleep(0.5)
        assert opened, "the outage never opened the circuit"
        held = Notification.objects.filter(status=Status.PENDING, circuit_held_since__isnull=False)
        assert held.exists(), "nothing was held while the circuit was open"
        assert not Notification.objects.filter(status=Status.DEAD_LETTERED).exists()
        calls_during_outage = len(provider.calls)
        assert not provider.sends  # nothing got through while it was down

        provider.down = False
        arrive(20)  # more arrive as it recovers
        try:
            wait_until(all_final, timeout_s=60, what="every notification final")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{workers.logs()}") from None
        counts = universal_check(provider, workers, webhooks=webhooks, rate_limit=(10, 3600.0))

    assert counts == {Status.SENT: len(created)}, counts
    assert len(provider.sends) == len(created)  # each sent exactly once
    # Held rows were never called: the outage's calls are the failures that opened the
    # circuit and the probes, far fewer than the notifications that waited.
    assert calls_during_outage < len(created) / 2, (calls_during_outage, len(created))
    attempts = Notification.objects.values_list("attempt_count", flat=True)
    assert max(attempts) < 6
