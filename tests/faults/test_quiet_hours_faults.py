"""Quiet hours against workers whose hosts' clocks are ten hours wrong (faketime), with the
database's clock moved across the window's end (DbClock, as every process sees it): what is
held waits for the window's end by the database's clock and the user's zone, whatever the
workers' clocks say; CRITICAL notifications and direct recipients go at once; each
notification is sent exactly once, and the universal check holds."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.utils import timezone

from notifications.models import Notification, Status
from notifyqueue.vocabulary import Priority
from preferences.repositories import QuietWindow
from preferences.services import PreferencesInput, preferences_put
from tests.faults.harness import (
    Workers,
    all_final,
    faketime_library,
    notifications_create,
    universal_check,
    wait_until,
)
from tests.support.clock import DbClock
from tests.support.http_servers import ScriptedProvider

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# A night ahead of any real time the suite runs at: the notifications are created due at the
# real time, which must already have come by the database clock the test sets (a night that
# real time had passed left them not yet due).
INSIDE = datetime(2030, 12, 9, 23, 0, tzinfo=UTC)  # 00:00 in Berlin
END = datetime(2030, 12, 10, 6, 30, tzinfo=UTC)  # 07:30 in Berlin
USERS = 12


def quiet_users_create(client) -> list[Notification]:
    """USERS users with a night's quiet hours in Berlin, each with one notification."""
    rows = []
    for n in range(USERS):
        user, address = f"u-{n}", f"u-{n}@example.com"
        preferences_put(
            client_id=client.id,
            user_id=user,
            preferences=PreferencesInput(
                channels=["email"],
                addresses={"email": address},
                muted_events=[],
                disabled_channels=[],
                timezone="Europe/Berlin",
                quiet_hours=[QuietWindow(start="22:00", end="07:30")],
            ),
            now=timezone.now(),
        )
        rows += notifications_create(client, [address], user_id=user, template="order_shipped")
    return rows


def test_workers_ten_hours_fast_and_slow_hold_quiet_hours_by_the_database_clock(
    database_url, client, webhooks
):
    faketime_library()
    clock = DbClock(INSIDE)
    held = quiet_users_create(client)
    critical = notifications_create(
        client, ["c@example.com"], user_id="u-0", template="order_shipped",
        priority=Priority.CRITICAL,
    )  # fmt: skip
    direct = notifications_create(client, ["direct@example.com"] * 3)
    with ScriptedProvider() as provider, Workers(database_url, provider.url) as workers:
        # A host ten hours fast believes the window ended long ago; one ten hours slow, that
        # it has not begun.
        workers.start(faketime="+10h")
        workers.start(faketime="-10h")

        def settled() -> bool:
            rows = Notification.objects.filter(id__in=[n.id for n in held])
            return (
                rows.filter(status=Status.PENDING, quiet_held_since__isnull=False).count() == USERS
                and not Notification.objects.filter(id__in=[n.id for n in critical + direct])
                .exclude(status=Status.SENT)
                .exists()
            )

        wait_until(settled, timeout_s=60, what="the users' rows held, the others sent")
        assert set(Notification.objects.filter(id__in=[n.id for n in held]).values_list(
            "due_at", "attempt_count"
        )) == {(END, 0)}  # fmt: skip
        sent_keys = set(provider.sends)
        assert not any(f"{n.id}:email" in sent_keys for n in held)

        clock.now = END
        wait_until(all_final, timeout_s=60, what="every notification final")
        counts = universal_check(provider, workers, webhooks=webhooks)

    assert counts == {Status.SENT: USERS + len(critical) + len(direct)}
    for notification in held:
        notification.refresh_from_db()
        assert notification.sent_at >= END
