"""What operators see of expiry and cancellation by key: the admin's EXPIRED status filter and
its cancellation-key filter and search, and the counts in `/metrics`."""

from __future__ import annotations

from datetime import timedelta

import pytest
from rest_framework.test import APIClient

from notifications.models import Status
from tests.integration.test_metrics import scrape, value
from tests.support.clock import DbClock, database_now
from tests.support.delivery_helpers import worker_build
from tests.support.factories import ClientFactory, NotificationFactory

LIST = "/admin/notifications/notification/"


def listed(response) -> set:
    return {row.pk for row in response.context["cl"].result_list}


@pytest.mark.django_db
def test_the_admin_filters_by_expired_and_by_cancellation_key_and_searches_the_key(superuser):
    acme, globex = ClientFactory(), ClientFactory()
    expired = NotificationFactory(client=acme, status=Status.EXPIRED, cancellation_key="order-7")
    keyed = NotificationFactory(client=globex, cancellation_key="order-7")
    NotificationFactory(client=acme, cancellation_key="order-8")
    NotificationFactory(client=acme)

    by_status = superuser.get(LIST, {"status__exact": "EXPIRED"})
    by_key = superuser.get(LIST, {"cancellation_key": "order-7"})
    both = superuser.get(LIST, {"cancellation_key": "order-7", "status__exact": "PENDING"})
    searched = superuser.get(LIST, {"q": "order-7"})

    assert by_status.status_code == 200
    assert listed(by_status) == {expired.pk}
    assert ">Expired<" in by_status.content.decode()  # the filter offers the status
    assert listed(by_key) == {expired.pk, keyed.pk}
    assert listed(both) == {keyed.pk}
    assert listed(searched) == {expired.pk, keyed.pk}
    page = superuser.get(f"{LIST}{expired.pk}/change/").content.decode()
    assert "order-7" in page and "Expires at" in page


@pytest.mark.django_db(transaction=True)
def test_metrics_count_expired_and_cancelled_notifications(api, acme):
    client, _ = acme
    clock = DbClock(database_now() + timedelta(seconds=5))
    before = scrape()
    NotificationFactory.create_batch(2, client=client, cancellation_key="k")
    NotificationFactory.create_batch(
        2,
        client=client,
        due_at=clock.now + timedelta(hours=1),
        expires_at=clock.now + timedelta(seconds=1),
    )
    single = NotificationFactory(client=client, due_at=clock.now + timedelta(hours=1))

    answer = api.post("/api/v1/notifications/cancel", {"cancellation_key": "k"}, format="json")
    assert answer.json() == {"cancelled": 2}
    assert APIClient.post(api, f"/api/v1/notifications/{single.id}/cancel").status_code == 200
    worker = worker_build()
    try:
        clock.advance(2)
        assert worker.expiry.run_once() == 2
    finally:
        worker.stop()
        worker._shutdown()
    after = scrape()

    def grew(name: str, **labels) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("notifyqueue_notifications_cancelled_total", how="key") == 2
    assert grew("notifyqueue_notifications_cancelled_total", how="id") == 1
    expired = grew("notifyqueue_notifications_finished_total", channel="email", status="EXPIRED")
    assert expired == 2
