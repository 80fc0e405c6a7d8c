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


def test_a_created_items_answer_is_the_row_as_stored(api):
    # A new row's answer is built from what was sent and the few columns the database chose
    # (id, times): it must read exactly as the stored row does, and as its replay does.
    items = [
        item("plain"),
        item(
            "rich",
            channel="sms",
            recipient="+4915112345678",
            subject="ignored?",
            body="ünïcødé ✉ \\ \" ' ,{}",
            priority="high",
            metadata={
                "z": 1,
                "a": [1.5, None, True, {"deep": "x"}],
                "big": 2**70,
                "e": 1e-7,
                "huge": 1e300,
                "zero": 0.0,
            },
        ),
        item("later", send_at="2030-01-02T03:04:05.123456+02:00"),
        item("past", send_at="2001-01-01T00:00:00Z"),
        item("delayed", delay_seconds=3600, priority="low"),
    ]
    created = api.post(URL, {"notifications": items}, format="json").json()["results"]
    assert [r["status"] for r in created] == [201] * len(items)

    replayed = api.post(URL, {"notifications": items}, format="json").json()["results"]
    for first, again in zip(created, replayed, strict=True):
        stored = api.get(f"/api/v1/notifications/{first['notification']['id']}").json()
        assert first["notification"] == stored
        assert again == {"status": 200, "notification": stored}
