"""GET/PUT /api/v1/users/{user_id}/preferences, and creates in preference mode."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from notifications.models import Notification

pytestmark = pytest.mark.django_db

PREFERENCES = {
    "channels": ["push", "email", "in_app"],
    "addresses": {"push": "device-token-1", "email": "ada@example.com"},
    "muted_events": ["newsletter"],
    "disabled_channels": [],
}
PAYLOAD = {"name": "Ada", "order": "A-17"}


def put_preferences(api: APIClient, user_id: str = "u-1", **changes):
    return api.put(
        f"/api/v1/users/{user_id}/preferences", {**PREFERENCES, **changes}, format="json"
    )


def put_template(api: APIClient, channel: str, body: str = "Order {order} for {name}") -> None:
    response = api.put(
        f"/api/v1/templates/order_shipped/{channel}",
        {"subject": f"{channel}: {{order}}", "body": body},
        format="json",
    )
    assert response.status_code in (200, 201), response.json()


def create(api: APIClient, key: str = "k-1", **fields):
    body = {"user_id": "u-1", "template": "order_shipped", "payload": PAYLOAD, **fields}
    return api.post("/api/v1/notifications", body, format="json", HTTP_IDEMPOTENCY_KEY=key)


def test_put_creates_then_replaces_and_get_reads_them(api):
    created = put_preferences(api)
    assert created.status_code == 201, created.json()
    assert put_preferences(api, channels=["email"]).status_code == 200
    got = api.get("/api/v1/users/u-1/preferences")
    assert got.status_code == 200
    body = got.json()
    assert body["user_id"] == "u-1"
    assert body["channels"] == ["email"]
    assert body["addresses"] == PREFERENCES["addresses"]
    assert (body["muted_events"], body["disabled_channels"]) == (["newsletter"], [])


def test_get_of_a_user_without_preferences_or_another_clients_user_is_404(api, make_client):
    _, other_key = make_client("other")
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Api-Key {other_key}")
    assert put_preferences(other).status_code == 201
    assert api.get("/api/v1/users/u-1/preferences").status_code == 404


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"channels": ["push", "fax"]}, "channels"),
        ({"channels": ["push", "push"]}, "channels"),
        ({"addresses": {"email": "not-an-email"}}, "addresses"),
        ({"addresses": {"sms": "12345"}}, "addresses"),
        ({"addresses": {"pager": "x"}}, "addresses"),
        ({"addresses": {"in_app": "someone-else"}}, "addresses"),
        ({"disabled_channels": ["fax"]}, "disabled_channels"),
        ({"quiet_hours": "22-07"}, "quiet_hours"),
    ],
)
def test_put_refuses_invalid_preferences(api, changes, field):
    response = put_preferences(api, **changes)
    assert response.status_code == 400
    assert field in response.json()["error"]["fields"]
    assert api.get("/api/v1/users/u-1/preferences").status_code == 404


def test_preference_mode_uses_the_first_usable_channel_and_keeps_the_rest_as_fallbacks(api):
    put_preferences(api, channels=["sms", "push", "email", "in_app"], disabled_channels=["sms"])
    for channel in ("push", "email", "in_app"):
        put_template(api, channel)
    response = create(api)
    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["channel"], body["recipient"]) == ("push", "device-token-1")
    assert body["fallback_channels"] == ["email", "in_app"]
    assert (body["user_id"], body["template"]) == ("u-1", "order_shipped")
    row = Notification.objects.get()
    assert (row.subject, row.body) == ("push: A-17", "Order A-17 for Ada")
    assert row.payload == PAYLOAD


def test_channels_without_an_address_or_a_template_are_skipped(api):
    put_preferences(api, addresses={"email": "ada@example.com"})  # push has no address
    put_template(api, "push")
    put_template(api, "email")  # in_app has no template
    body = create(api).json()
    assert (body["channel"], body["recipient"], body["fallback_channels"]) == (
        "email",
        "ada@example.com",
        [],
    )


def test_no_usable_channel_answers_422_with_each_channels_reason(api):
    put_preferences(
        api,
        channels=["push", "sms", "email", "in_app"],
        disabled_channels=["push"],
        addresses={"email": "ada@example.com"},
    )
    put_template(api, "sms")
    response = create(api)
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "no_usable_channel"
    assert error["fields"] == {
        "push": ["opted_out"],
        "sms": ["no_address"],
        "email": ["no_template"],
        "in_app": ["no_template"],
    }
    assert "push: opted out" in error["message"]
    assert Notification.objects.count() == 0


def test_a_muted_event_has_no_usable_channel(api):
    put_preferences(api, muted_events=["order_shipped"])
    put_template(api, "push")
    response = create(api)
    assert response.status_code == 422
    assert response.json()["error"]["fields"] == {
        "push": ["muted"],
        "email": ["muted"],
        "in_app": ["muted"],
    }


def test_a_fallback_whose_template_the_payload_cannot_fill_is_a_400(api):
    put_preferences(api)
    put_template(api, "push")
    put_template(api, "email", body="Track it at {url}")
    response = create(api)
    assert response.status_code == 400
    assert response.json()["error"]["fields"]["payload"] == ["Missing placeholder: url"]
    assert Notification.objects.count() == 0


def test_preference_mode_takes_no_channel_or_recipient(api):
    response = create(api, channel="email", recipient="ada@example.com")
    assert response.status_code == 400
    assert "user_id" in response.json()["error"]["fields"]


def test_a_replay_after_the_user_opted_out_still_answers_200_and_a_change_409(api):
    put_preferences(api)
    put_template(api, "push")
    first = create(api)
    put_preferences(api, disabled_channels=["push", "email", "in_app"])
    replay = create(api)
    assert (first.status_code, replay.status_code) == (201, 200)
    assert replay.json()["id"] == first.json()["id"]
    assert create(api, payload={"name": "Bob", "order": "A-17"}).status_code == 409
    assert create(api, key="k-2").status_code == 422
    assert Notification.objects.count() == 1


def test_batch_creates_in_preference_mode_item_by_item(api):
    put_preferences(api)
    put_template(api, "push")
    put_preferences(api, user_id="u-muted", muted_events=["order_shipped"])
    item = {"user_id": "u-1", "template": "order_shipped", "payload": PAYLOAD}
    response = api.post(
        "/api/v1/notifications/batch",
        {
            "notifications": [
                {**item, "idempotency_key": "a"},
                {**item, "idempotency_key": "a"},
                {**item, "user_id": "u-muted", "idempotency_key": "b"},
                {**item, "payload": {}, "idempotency_key": "c"},
            ]
        },
        format="json",
    )
    assert response.status_code == 200
    results = response.json()["results"]
    assert [r["status"] for r in results] == [201, 200, 422, 400]
    assert results[0]["notification"]["channel"] == "push"
    assert results[2]["error"]["code"] == "no_usable_channel"
    assert results[3]["error"]["code"] == "missing_placeholders"
    assert Notification.objects.count() == 1
