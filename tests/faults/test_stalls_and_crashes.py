"""Workers stopped past their claim timeout, killed mid-batch, and cut off from PostgreSQL:
every notification still ends exactly once."""

from __future__ import annotations

import signal
import time

import pytest
from django.db import connection

from delivery.models import DeliveryAttempt, Outcome
from notifications.models import Notification, Status
from tests.faults.harness import (
    Workers,
    all_final,
    notifications_create,
    universal_check,
    wait_until,
)
from tests.support.http_servers import ScriptedProvider

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def sent() -> int:
    return Notification.objects.filter(status=Status.SENT).count()


def test_sigstop_past_the_claim_timeout_then_sigkill_mid_batch(database_url, client, webhooks):
    """A is frozen (SIGSTOP) past its 2 s claims with sends in flight, so B's reaper takes
    them over; A then resumes and its late results change nothing. B is SIGKILLed mid-batch
    and C finishes. Every notification ends exactly once."""
    with ScriptedProvider(delay_s=0.3) as provider, Workers(database_url, provider.url) as workers:
        notifications_create(client, [f"user{i}@example.com" for i in range(90)])
        a, b = workers.start(), workers.start()
        wait_until(lambda: sent() >= 5, timeout_s=30, what="the first sends")
        a.send_signal(signal.SIGSTOP)
        # A statement A sent just before it stopped still runs to its commit in A's backend
        # (a finish would end rows that would otherwise count as held): let it.
        time.sleep(0.5)
        held = set(
            Notification.objects.filter(
                status=Status.PROCESSING, claimed_by__contains=f":{a.pid}:"
            ).values_list("id", flat=True)
        )
        time.sleep(3.0)  # past A's claim timeout: B reaps A's claims and sends them again
        a.send_signal(signal.SIGCONT)
        wait_until(lambda: sent() >= 45, timeout_s=60, what="half sent")
        b.send_signal(signal.SIGKILL)
        workers.start()
        wait_until(all_final, timeout_s=90, what="every notification final")
        counts = universal_check(provider, workers, webhooks=webhooks)

    assert counts == {Status.SENT: 90}
    assert held, "A held no claim when it was frozen: nothing was tested"
    abandoned = DeliveryAttempt.objects.filter(outcome=Outcome.ABANDONED)
    assert held <= set(abandoned.values_list("notification_id", flat=True))  # taken over


def test_every_database_session_terminated_mid_batch_loses_and_repeats_nothing(
    database_url, client, webhooks
):
    with ScriptedProvider(delay_s=0.05) as provider, Workers(database_url, provider.url) as workers:
        notifications_create(client, [f"user{i}@example.com" for i in range(120)])
        workers.start()
        workers.start()
        for _ in range(4):
            time.sleep(0.7)
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
        wait_until(all_final, timeout_s=120, what="every notification final")
        counts = universal_check(provider, workers, webhooks=webhooks)  # none died of it

    assert counts == {Status.SENT: 120}
