"""What operators see of digests: the admin's list of open buckets (and a collected
notification held by `digest`), and the counts in `/metrics`."""

from __future__ import annotations

from datetime import timedelta

import pytest

from notifications.models import DigestState, NotificationDigest
from tests.integration.test_digests_delivery import closer, create
from tests.integration.test_metrics import scrape, value
from tests.support.clock import DbClock, database_now
from tests.support.factories import ClientFactory

BUCKETS = "/admin/notifications/notificationdigest/"
NOTIFICATIONS = "/admin/notifications/notification/"


@pytest.fixture
def owner():
    from templates.services import template_put
    from tests.integration.test_digests_delivery import EVENT

    owner = ClientFactory()
    template_put(
        client_id=owner.id,
        event=EVENT,
        channel="email",
        subject="{who}",
        body="{digest_count}: {digest_items} ({post})",
        now=database_now(),
    )
    return owner


def listed(response) -> set:
    return {row.pk for row in response.context["cl"].result_list}


@pytest.mark.django_db(transaction=True)
def test_the_admin_lists_open_buckets_and_a_collected_notification_as_held(superuser, owner):
    clock = DbClock(database_now() + timedelta(seconds=5))
    create(owner, "a", digest_key="soon", window=60)
    held = create(owner, "b", digest_key="soon", window=60)
    create(owner, "c", digest_key="later", window=3600)
    clock.advance(61)
    closer().run_once()
    soon = NotificationDigest.objects.get(digest_key="soon")
    later = NotificationDigest.objects.get(digest_key="later")
    assert soon.state == DigestState.CLOSED

    page = superuser.get(BUCKETS)
    assert page.status_code == 200
    assert listed(page) == {later.pk}  # open ones only, by default
    assert listed(superuser.get(BUCKETS, {"state": "CLOSED"})) == {soon.pk}
    assert listed(superuser.get(BUCKETS, {"q": "soon", "state": "CLOSED"})) == {soon.pk}
    detail = superuser.get(f"{BUCKETS}{later.pk}/change/")
    assert detail.status_code == 200 and "later" in detail.content.decode()
    waiting = create(owner, "d", digest_key="later", window=3600)
    by_held = superuser.get(NOTIFICATIONS, {"held": "digest"})
    assert listed(by_held) == {waiting.id}
    assert held.id not in listed(by_held)  # DIGESTED now


@pytest.mark.django_db(transaction=True)
def test_metrics_count_collected_events_and_closed_digests(owner):
    clock = DbClock(database_now() + timedelta(seconds=5))
    before = scrape()
    for i in range(4):
        create(owner, f"k-{i}", window=60)
    create(owner, "alone", digest_key="alone", window=60)
    clock.advance(61)
    assert closer().run_once() == 2
    after = scrape()

    def grew(name: str, **labels) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("notifyqueue_digest_events_collected_total", channel="email") == 3
    assert grew("notifyqueue_digests_closed_total", channel="email", outcome="sent") == 1
    assert grew("notifyqueue_digests_closed_total", channel="email", outcome="empty") == 1
    digested = grew("notifyqueue_notifications_finished_total", channel="email", status="DIGESTED")
    assert digested == 3
