"""The claim order with real workers racing and dying: one client floods HIGH rows while quiet
clients wait with NORMAL ones and a LOW backlog ages; the quiet rows still go out in turn,
near the start of the flood, and after a worker is SIGKILLed mid-flood every notification still
ends exactly once."""

from __future__ import annotations

import signal
from datetime import timedelta

import pytest
from django.utils import timezone

from notifications.models import Notification, Status
from notifyqueue.vocabulary import Priority
from tests.faults.harness import Workers, all_final, universal_check, wait_until
from tests.support.factories import ClientFactory, NotificationFactory
from tests.support.http_servers import ScriptedProvider

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

FLOOD = 200
QUIET_CLIENTS = 3
QUIET_ROWS = 5


def test_quiet_clients_go_in_turn_beside_a_high_flood_and_a_killed_worker_loses_nothing(
    database_url, client, webhooks
):
    quiet_clients = [ClientFactory(webhook_url=webhooks.url) for _ in range(QUIET_CLIENTS)]
    # Recipients spread so no one nears the rate limit of 10 an hour.
    flood = [
        NotificationFactory(
            client=client, priority=Priority.HIGH, recipient=f"f{i}@example.com", max_attempts=4
        )
        for i in range(FLOOD)
    ]
    # The flooder's own LOW rows, overdue by many aging periods: they stand at HIGH.
    aged = [
        NotificationFactory(
            client=client,
            priority=Priority.LOW,
            recipient=f"old{i}@example.com",
            due_at=timezone.now() - timedelta(minutes=5),
            max_attempts=4,
        )
        for i in range(10)
    ]
    quiet = [
        NotificationFactory(
            client=owner, priority=Priority.NORMAL, recipient=f"q{n}-{i}@example.com"
        )
        for n, owner in enumerate(quiet_clients)
        for i in range(QUIET_ROWS)
    ]
    critical = NotificationFactory(client=quiet_clients[0], priority=Priority.CRITICAL)
    with (
        ScriptedProvider(delay_s=0.1) as provider,
        Workers(database_url, provider.url, NOTIFYQUEUE_PRIORITY_AGING_SECONDS="1") as workers,
    ):
        first, _ = workers.start(), workers.start()
        quiet_keys = {f"{n.id}:email" for n in quiet}
        try:
            wait_until(
                lambda: quiet_keys <= {c.key for c in provider.calls},
                timeout_s=60,
                what="every quiet row sent",
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{workers.logs()}") from None
        calls_when_quiet_done = len(provider.calls)
        first.send_signal(signal.SIGKILL)  # mid-flood, with sends in flight and claims waiting
        workers.start()
        wait_until(all_final, timeout_s=120, what="every notification final")
        counts = universal_check(provider, workers, webhooks=webhooks)

    total = len(flood) + len(aged) + len(quiet) + 1
    assert counts == {Status.SENT: total}
    # Four clients take turns: the quiet ones' 15 rows went out within the first few dozen of
    # 226 sends, not after the flood.
    assert calls_when_quiet_done <= 4 * len(quiet), calls_when_quiet_done
    order = [c.key for c in provider.calls]
    assert order.index(f"{critical.id}:email") < 16  # CRITICAL: among the first claims
    assert Notification.objects.filter(status=Status.SENT).count() == total


def test_on_a_slow_provider_a_late_client_goes_in_turn_and_sigterm_gives_back_the_ready_claim(
    database_url, client, webhooks
):
    """A real worker (4 send slots) on a provider taking 0.5 s a call, one client's flood: once
    its calls are timed it holds one claim ready for a slot (not two), so a client whose rows
    arrive mid-flood waits behind that one and its turns: its 4 rows go among the next 10
    calls. SIGTERM then: the calls in flight are recorded, the claim held ready is given back
    with its attempt returned; another worker sends the rest, each once, none with an attempt
    lost (every notification SENT at its first attempt)."""
    late_client = ClientFactory(webhook_url=webhooks.url)
    flood = [
        NotificationFactory(client=client, recipient=f"s{i}@example.com", max_attempts=4)
        for i in range(40)
    ]
    with (
        ScriptedProvider(delay_s=0.5) as provider,
        Workers(database_url, provider.url) as workers,
    ):
        first = workers.start()
        wait_until(lambda: len(provider.calls) >= 12, timeout_s=60, what="three rounds of calls")
        before = len(provider.calls)
        late = [
            NotificationFactory(client=late_client, recipient=f"late{i}@example.com")
            for i in range(4)
        ]
        late_keys = {f"{n.id}:email" for n in late}
        wait_until(
            lambda: late_keys <= {c.key for c in provider.calls},
            timeout_s=60,
            what="the late client's rows sent",
        )
        order = "".join("L" if c.key in late_keys else "f" for c in provider.calls[before:])
        first.send_signal(signal.SIGTERM)  # sends in flight, one claim held ready
        assert first.wait(timeout=30) == 0, workers.logs()
        assert Notification.objects.filter(status=Status.PROCESSING).count() == 0
        workers.start()
        wait_until(all_final, timeout_s=120, what="every notification final")
        counts = universal_check(provider, workers, webhooks=webhooks)

    assert order.rindex("L") < 10, order
    assert counts == {Status.SENT: len(flood) + len(late)}
    # A claim given back unsent returned its attempt: every row went at its first.
    assert set(Notification.objects.values_list("attempt_count", flat=True)) == {1}
