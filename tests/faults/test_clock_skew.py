"""Workers whose hosts run an hour fast or an hour slow (faketime) keep the database's
schedule: nothing is sent early and no rate window is exceeded
(docs/decisions/0006-the-database-clock.md)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from notifications.models import Notification, Status
from tests.faults.harness import (
    Workers,
    all_final,
    faketime_library,
    notifications_create,
    universal_check,
    wait_until,
)
from tests.support.clock import database_now
from tests.support.http_servers import ScriptedProvider

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

LIMIT, WINDOW_S = 2, 3.0


def test_workers_an_hour_fast_and_an_hour_slow_keep_the_database_schedule(
    database_url, client, webhooks
):
    faketime_library()
    with (
        ScriptedProvider() as provider,
        Workers(
            database_url,
            provider.url,
            NOTIFYQUEUE_RATE_LIMIT=str(LIMIT),
            NOTIFYQUEUE_RATE_LIMIT_WINDOW_SECONDS=str(WINDOW_S),
        ) as workers,
    ):
        busy = notifications_create(client, ["ada@example.com"] * 7)
        due = database_now() + timedelta(seconds=4)
        [later] = notifications_create(client, ["later@example.com"], send_at=due, due_at=due)
        workers.start(faketime="+1h")
        workers.start(faketime="-1h")
        wait_until(all_final, timeout_s=60, what="every notification final")

        counts = universal_check(provider, workers, webhooks=webhooks, rate_limit=(LIMIT, WINDOW_S))

    assert counts == {Status.SENT: len(busy) + 1}
    sent_at = provider.sends[f"{later.id}:email"].at
    assert sent_at >= due.timestamp(), "the fast worker sent a delayed notification early"
    later.refresh_from_db()
    assert later.sent_at >= due
    assert Notification.objects.get(id=later.id).status == Status.SENT
