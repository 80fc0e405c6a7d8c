"""POST /api/v1/notifications/batch: each item is created on its own through the same service."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from notifications.models import Notification
from tests.support.factories import NotificationFactory

pytestmark = pytest.mark.django_db

URL = "/api/v1/notifications/batch"


def item(key: str, **fields) -> dict:
    return {"channel": "email", "recipient": "ada@example.com", "body": "Hi",
            "idempotency_key": key, **fields}  # fmt: skip


def test_batch_answers_one_result_per_item_in_order(api):
    response = api.post(
        URL,
        {
            "notifications": [
                item("a"),
                item("b", channel="sms", recipient="12345"),
                item("a"),
                item("a", body="changed"),
                item("c", priority="low", delay_seconds=60),
                "not an object",
                {"channel": "email", "recipient": "ada@example.com", "body": "no key"},
                item("t", body=None, template="welcome"),
            ]
        },
        format="json",
    )
    assert response.status_code == 200
    results = response.json()["results"]
    assert [r["status"] for r in results] == [201, 400, 200, 409, 201, 400, 400, 400]
    assert results[0]["notification"]["id"] == results[2]["notification"]["id"]
    assert results[1]["error"]["code"] == "invalid_request"
    assert "recipient" in results[1]["error"]["fields"]
    assert results[3]["error"]["code"] == "idempotency_key_reused"
    assert results[4]["notification"]["priority"] == "LOW"
    assert "non_field_errors" in results[5]["error"]["fields"]
    assert "idempotency_key" in results[6]["error"]["fields"]
    assert results[7]["error"]["code"] == "invalid_request"
    assert Notification.objects.count() == 2


def test_batch_items_replay_single_creates_with_the_same_key(api):
    single = api.post(
        "/api/v1/notifications",
        {"channel": "email", "recipient": "ada@example.com", "body": "Hi"},
        format="json",
        HTTP_IDEMPOTENCY_KEY="shared",
    )
    batch = api.post(URL, {"notifications": [item("shared")]}, format="json")
    assert batch.json()["results"][0] == {"status": 200, "notification": single.json()}


@pytest.mark.parametrize(
    "body, field",
    [
        ({}, "notifications"),
        ({"notifications": []}, "notifications"),
        ({"notifications": {"a": 1}}, "notifications"),
        ({"notifications": [item(str(n)) for n in range(1001)]}, "notifications"),
        ({"notifications": [item("a")], "extra": True}, "extra"),
    ],
)
def test_a_bad_envelope_answers_400_and_creates_nothing(api, body, field):
    response = api.post(URL, body, format="json")
    assert response.status_code == 400
    assert field in response.json()["error"]["fields"]
    assert Notification.objects.count() == 0


def test_a_batch_of_1000_is_accepted(api):
    response = api.post(URL, {"notifications": [item(str(n)) for n in range(1000)]}, format="json")
    assert response.status_code == 200
    assert {r["status"] for r in response.json()["results"]} == {201}
    assert Notification.objects.count() == 1000


def test_batch_over_the_backlog_answers_429(api, acme, settings):
    settings.NOTIFYQUEUE_CLIENT_MAX_PENDING = 1
    NotificationFactory.create_batch(2, client=acme[0])
    response = api.post(URL, {"notifications": [item("a")]}, format="json")
    assert response.status_code == 429
    assert response["Retry-After"] == "30"
    assert Notification.objects.count() == 2


def test_batch_needs_an_api_key(db):
    assert APIClient().post(URL, {"notifications": [item("a")]}, format="json").status_code == 401
