"""A recipient with a large backlog at its rate limit, deferred a bounded chunk at a time by
workers one of which is SIGKILLed mid-way: every notification still ends exactly once, no
window goes over its limit, and the client's other recipients are not held back behind the
backlog (docs/decisions/0024-bounded-deferrals.md)."""

from __future__ import annotations

import signal
import time
from datetime import timedelta

import pytest

from notifications.models import Notification, Status
from tests.faults.harness import Workers, all_final, universal_check, wait_until
from tests.support.clock import database_now
from tests.support.factories import ClientFactory
from tests.support.http_servers import ScriptedProvider
from tests.support.operator_helpers import notifications_insert_bulk

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

LIMIT, WINDOW_S = 150, 1.5
HELD, BACKLOG, OTHERS = "held@example.com", 3000, 60


def test_a_backlog_at_its_limit_with_a_worker_killed_mid_way_ends_exactly_once(database_url):
    """3,000 rows of one recipient, due before anything else of its client, at 150 a 1.5 s
    window; behind them 60 rows of other recipients. Two workers claim the backlog, defer it
    in bounded chunks and send it a window at a time; one is SIGKILLed once the backlog's
    sends are under way (claims in flight, rows held), a third takes its place. The others
    are all sent within a few seconds, long before the backlog is; then everything ends
    exactly once, one idempotency key a send, no window over its limit."""
    client = ClientFactory()
    notifications_insert_bulk(
        client_id=client.id,
        count=BACKLOG,
        status="PENDING",
        recipient=HELD,
        start=database_now() - timedelta(hours=2),
        attempt_count=0,
        last_error=None,
    )
    notifications_insert_bulk(
        client_id=client.id, count=OTHERS, status="PENDING", attempt_count=0, last_error=None
    )
    others = Notification.objects.exclude(recipient=HELD)
    held_sent = Notification.objects.filter(recipient=HELD, status=Status.SENT)
    with (
        ScriptedProvider() as provider,
        Workers(
            database_url,
            provider.url,
            NOTIFYQUEUE_RATE_LIMIT=str(LIMIT),
            NOTIFYQUEUE_RATE_LIMIT_WINDOW_SECONDS=str(WINDOW_S),
        ) as workers,
    ):
        a = workers.start()
        workers.start()
        started = time.monotonic()
        wait_until(
            lambda: not others.exclude(status=Status.SENT).exists(),
            timeout_s=20,
            what="the client's other recipients sent",
        )
        others_sent_s = time.monotonic() - started
        wait_until(lambda: held_sent.count() >= 2 * LIMIT, timeout_s=30, what="two windows")
        a.send_signal(signal.SIGKILL)
        workers.start()
        wait_until(all_final, timeout_s=120, what="every notification final")
        counts = universal_check(provider, workers, rate_limit=(LIMIT, WINDOW_S))

    assert counts == {Status.SENT: BACKLOG + OTHERS}
    # The backlog takes 20 windows (30 s); the others went in the first few seconds.
    assert others_sent_s < 10, others_sent_s
