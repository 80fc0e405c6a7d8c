"""A create's `expires_at`, `ttl_seconds` and `cancellation_key` over HTTP: their bounds,
their rules, the database clock deciding, and how they show in the representation and in
idempotency. The worker's side is in test_expiry_delivery.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
from rest_framework.test import APIClient

from notifications.models import Notification
from notifications.serializers import TTL_SECONDS_MAX
from tests.support.clock import DbClock, database_now

pytestmark = pytest.mark.django_db

URL = "/api/v1/notifications"
VALID = {"channel": "email", "recipient": "ada@example.com", "subject": "Hi", "body": "Welcome"}


def post(api: APIClient, body: dict, key: str = "key-1"):
    return api.post(URL, body, format="json", HTTP_IDEMPOTENCY_KEY=key)


def iso(moment) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def test_a_time_to_live_counts_from_the_send_time_and_shows_as_expires_at(api):
    clock = DbClock()
    response = post(api, {**VALID, "delay_seconds": 60, "ttl_seconds": 600})
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["expires_at"] == iso(clock.now + timedelta(seconds=660))
    assert body["cancellation_key"] is None
    row = Notification.objects.get()
    assert row.expires_at == clock.now + timedelta(seconds=660)
    # The same in every read of it.
    read = api.get(f"{URL}/{body['id']}").json()
    assert (read["expires_at"], read["cancellation_key"]) == (body["expires_at"], None)


def test_an_expiry_and_a_cancellation_key_are_stored_as_given_and_shown(api):
    clock = DbClock()
    expires = clock.now + timedelta(hours=2)
    response = post(api, {**VALID, "expires_at": iso(expires), "cancellation_key": "login-u-1 #3"})
    assert response.status_code == 201, response.json()
    assert response.json()["expires_at"] == iso(expires)
    assert response.json()["cancellation_key"] == "login-u-1 #3"
    listed = api.get(URL).json()["results"][0]
    assert (listed["expires_at"], listed["cancellation_key"]) == (iso(expires), "login-u-1 #3")


def test_the_database_clock_decides_whether_expires_at_precedes_the_send_time(api):
    # The database's clock is a day behind this process's: an expires_at an hour from the
    # process's now is far ahead by the database's, and one a day and a half behind it is in
    # the database's past.
    clock = DbClock(database_now() - timedelta(days=1))
    ahead = clock.now + timedelta(hours=25)
    assert post(api, {**VALID, "expires_at": iso(ahead)}, key="a").status_code == 201
    past = clock.now - timedelta(seconds=1)
    refused = post(api, {**VALID, "expires_at": iso(past)}, key="b")
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "expires_before_send"
    assert "expires_at" in refused.json()["error"]["fields"]
    # After a delay: the send time is the database's now plus the delay.
    soon = clock.now + timedelta(seconds=30)
    delayed = post(api, {**VALID, "delay_seconds": 60, "expires_at": iso(soon)}, key="c")
    assert delayed.status_code == 400
    sooner = post(api, {**VALID, "delay_seconds": 20, "expires_at": iso(soon)}, key="d")
    assert sooner.status_code == 201
    # A send_at in the past means now: the expiry must still be later than now.
    old = iso(clock.now - timedelta(hours=1))
    assert post(api, {**VALID, "send_at": old, "expires_at": iso(past)}, key="e").status_code == 400
    assert Notification.objects.count() == 2


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"expires_at": "2026-12-01T12:00:00Z", "ttl_seconds": 60}, "ttl_seconds"),
        ({"ttl_seconds": 0}, "ttl_seconds"),
        ({"ttl_seconds": -5}, "ttl_seconds"),
        ({"ttl_seconds": TTL_SECONDS_MAX + 1}, "ttl_seconds"),
        ({"ttl_seconds": 1.5}, "ttl_seconds"),
        ({"ttl_seconds": "60"}, "ttl_seconds"),
        ({"ttl_seconds": True}, "ttl_seconds"),
        ({"ttl_seconds": 10**30}, "ttl_seconds"),
        ({"expires_at": "9999-12-31T23:59:59Z"}, "expires_at"),
        ({"expires_at": "2026-12-01T12:00:00"}, "expires_at"),
        ({"expires_at": "tomorrow"}, "expires_at"),
        ({"expires_at": "1969-12-31T23:59:59Z"}, "expires_at"),
        ({"expires_at": 1767225600}, "expires_at"),
        ({"expires_at": "2026-12-01T12:00:00\u2028Z"}, "expires_at"),
        (
            {"send_at": "2030-12-01T12:00:00Z", "expires_at": "2030-12-01T12:00:00Z"},
            "expires_at",
        ),
        ({"cancellation_key": ""}, "cancellation_key"),
        ({"cancellation_key": " "}, "cancellation_key"),
        ({"cancellation_key": "k" * 256}, "cancellation_key"),
        ({"cancellation_key": "a\x00b"}, "cancellation_key"),
        ({"cancellation_key": "a\nb"}, "cancellation_key"),
        ({"cancellation_key": "a\u2028b"}, "cancellation_key"),
        ({"cancellation_key": "clé"}, "cancellation_key"),
        ({"cancellation_key": ["k"]}, "cancellation_key"),
        ({"cancellation_key": None}, "cancellation_key"),
    ],
)
def test_a_bad_expiry_or_cancellation_key_is_a_400_naming_it_and_creates_nothing(
    api, fields, field
):
    response = post(api, {**VALID, **fields})
    assert response.status_code == 400, response.json()
    assert field in response.json()["error"]["fields"], response.json()
    assert not Notification.objects.exists()


def test_the_bounds_are_accepted_at_their_edges(api):
    clock = DbClock()
    edge_key = "~" * 255
    response = post(api, {**VALID, "ttl_seconds": TTL_SECONDS_MAX, "cancellation_key": edge_key})
    assert response.status_code == 201, response.json()
    row = Notification.objects.get()
    assert row.expires_at == clock.now + timedelta(seconds=TTL_SECONDS_MAX)
    assert row.cancellation_key == edge_key
    assert post(api, {**VALID, "ttl_seconds": 1}, key="k2").status_code == 201


def test_expiry_and_cancellation_key_take_part_in_idempotency(api):
    DbClock()
    first = post(api, {**VALID, "ttl_seconds": 60, "cancellation_key": "g"})
    assert first.status_code == 201
    assert post(api, {**VALID, "ttl_seconds": 60, "cancellation_key": "g"}).status_code == 200
    assert post(api, {**VALID, "ttl_seconds": 61, "cancellation_key": "g"}).status_code == 409
    assert post(api, {**VALID, "ttl_seconds": 60, "cancellation_key": "h"}).status_code == 409
    assert post(api, {**VALID, "ttl_seconds": 60}).status_code == 409
    # A request without either fingerprints as it always did.
    assert post(api, VALID, key="plain").status_code == 201
    assert post(api, VALID, key="plain").status_code == 200


def test_a_replay_is_answered_after_its_expiry_time_has_passed(api):
    clock = DbClock()
    body = {**VALID, "expires_at": iso(clock.now + timedelta(seconds=30))}
    assert post(api, body).status_code == 201
    clock.advance(60)
    replay = post(api, body)
    assert replay.status_code == 200, replay.json()


def test_a_batch_item_that_expires_before_its_send_time_is_its_own_400(api):
    clock = DbClock()
    items = [
        {**VALID, "idempotency_key": "ok", "ttl_seconds": 30, "cancellation_key": "b"},
        {**VALID, "idempotency_key": "late", "expires_at": iso(clock.now - timedelta(seconds=1))},
        {**VALID, "idempotency_key": "both", "expires_at": iso(clock.now), "ttl_seconds": 3},
        {**VALID, "idempotency_key": "timed", "expires_at": iso(clock.now + timedelta(hours=1))},
    ]
    response = api.post(f"{URL}/batch", {"notifications": items}, format="json")
    assert response.status_code == 200, response.json()
    results = response.json()["results"]
    assert [r["status"] for r in results] == [201, 400, 400, 201]
    assert results[0]["notification"]["expires_at"] == iso(clock.now + timedelta(seconds=30))
    assert results[0]["notification"]["cancellation_key"] == "b"
    assert results[1]["error"]["code"] == "expires_before_send"
    assert results[3]["notification"]["expires_at"] == iso(clock.now + timedelta(hours=1))
    assert Notification.objects.count() == 2


def test_preference_mode_carries_the_expiry_and_the_key(api, acme):
    clock = DbClock()
    api.put(
        "/api/v1/templates/order_shipped/email",
        {"subject": "Shipped", "body": "Order {order} shipped"},
        format="json",
    )
    api.put(
        "/api/v1/users/u-1/preferences",
        {"channels": ["email"], "addresses": {"email": "ada@example.com"}},
        format="json",
    )
    body = {
        "user_id": "u-1",
        "template": "order_shipped",
        "payload": {"order": "A-17"},
        "ttl_seconds": 120,
        "cancellation_key": "order-A-17",
    }
    response = post(api, body)
    assert response.status_code == 201, response.json()
    assert response.json()["expires_at"] == iso(clock.now + timedelta(seconds=120))
    assert response.json()["cancellation_key"] == "order-A-17"
