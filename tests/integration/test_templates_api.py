"""PUT/GET /api/v1/templates/{event}/{channel}, and creates that render a template."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from notifications.models import Notification

pytestmark = pytest.mark.django_db

SHIPPED = {"subject": "Order {order} shipped", "body": "Hi {name}, order {order} is on its way."}


def put(api: APIClient, event: str, channel: str, body: dict):
    return api.put(f"/api/v1/templates/{event}/{channel}", body, format="json")


def create(api: APIClient, body: dict, key: str = "k-1"):
    return api.post("/api/v1/notifications", body, format="json", HTTP_IDEMPOTENCY_KEY=key)


def test_put_creates_then_replaces_and_get_reads_it(api):
    created = put(api, "order_shipped", "email", SHIPPED)
    assert created.status_code == 201, created.json()
    assert created.json()["placeholders"] == ["name", "order"]
    replaced = put(api, "order_shipped", "email", {"body": "Shipped: {order}"})
    assert replaced.status_code == 200
    got = api.get("/api/v1/templates/order_shipped/email")
    assert got.status_code == 200
    body = got.json()
    assert (body["event"], body["channel"], body["subject"], body["body"]) == (
        "order_shipped",
        "email",
        "",
        "Shipped: {order}",
    )
    assert body["created_at"] == created.json()["created_at"]


def test_get_of_a_missing_template_or_another_clients_is_404(api, make_client):
    assert api.get("/api/v1/templates/nothing/email").status_code == 404
    _, other_key = make_client("other")
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Api-Key {other_key}")
    assert put(other, "order_shipped", "email", SHIPPED).status_code == 201
    response = api.get("/api/v1/templates/order_shipped/email")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize(
    ("channel", "body", "field"),
    [
        ("email", {"body": "Hi {user.name}"}, "body"),
        ("email", {"subject": "Hi {", "body": "x"}, "subject"),
        ("email", {"subject": "two\nlines", "body": "x"}, "subject"),
        ("fax", {"body": "x"}, "channel"),
        ("email", {"body": "x", "html": "<b>"}, "html"),
        ("email", {"subject": "no body"}, "body"),
    ],
)
def test_put_refuses_a_broken_template_and_saves_nothing(api, channel, body, field):
    response = put(api, "order_shipped", channel, body)
    assert response.status_code == 400
    assert field in response.json()["error"]["fields"]
    assert api.get(f"/api/v1/templates/order_shipped/{channel}").status_code == 404


def test_templates_need_an_api_key():
    assert APIClient().get("/api/v1/templates/order_shipped/email").status_code == 401


def test_create_with_a_template_renders_it_and_stores_template_and_payload(api):
    put(api, "order_shipped", "email", SHIPPED)
    response = create(
        api,
        {"channel": "email", "recipient": "ada@example.com", "template": "order_shipped",
         "payload": {"name": "Ada", "order": "A-17"}},
    )  # fmt: skip
    assert response.status_code == 201, response.json()
    assert response.json()["template"] == "order_shipped"
    row = Notification.objects.get()
    assert (row.subject, row.body) == ("Order A-17 shipped", "Hi Ada, order A-17 is on its way.")
    assert row.payload == {"name": "Ada", "order": "A-17"}


def test_missing_placeholders_answer_400_naming_them_and_nothing_is_queued(api):
    put(api, "order_shipped", "email", SHIPPED)
    response = create(
        api,
        {"channel": "email", "recipient": "ada@example.com", "template": "order_shipped",
         "payload": {"nam": "Ada"}},
    )  # fmt: skip
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "missing_placeholders"
    assert error["fields"]["payload"] == ["Missing placeholder: name", "Missing placeholder: order"]
    assert Notification.objects.count() == 0


def test_a_template_for_another_channel_is_an_unknown_template(api):
    put(api, "order_shipped", "email", SHIPPED)
    response = create(
        api,
        {"channel": "sms", "recipient": "+447700900123", "template": "order_shipped",
         "payload": {"name": "Ada", "order": "A-17"}},
    )  # fmt: skip
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "unknown_template"
    assert "sms" in error["message"] and "order_shipped" in error["message"]
    assert Notification.objects.count() == 0


def test_a_body_over_64_kib_after_rendering_is_refused(api):
    put(api, "big", "sms", {"body": "{a}{a}"})
    response = create(
        api,
        {"channel": "sms", "recipient": "+447700900123", "template": "big",
         "payload": {"a": "x" * 40_000}},
    )  # fmt: skip
    assert response.status_code == 400
    assert "after rendering" in response.json()["error"]["message"]
    assert Notification.objects.count() == 0


def test_a_replay_answers_200_even_after_the_template_changed(api):
    put(api, "order_shipped", "email", SHIPPED)
    request = {"channel": "email", "recipient": "ada@example.com", "template": "order_shipped",
               "payload": {"name": "Ada", "order": "A-17"}}  # fmt: skip
    first = create(api, request)
    put(api, "order_shipped", "email", {"body": "now needs {tracking}"})
    replay = create(api, request)
    assert (first.status_code, replay.status_code) == (201, 200)
    assert replay.json()["id"] == first.json()["id"]
    changed = create(api, {**request, "payload": {"name": "Bob", "order": "A-17"}})
    assert changed.status_code == 409
    assert Notification.objects.count() == 1
