"""POST /api/v1/notifications over HTTP, against real PostgreSQL."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from notifications.models import Notification, Priority, Status
from tests.support.factories import NotificationFactory

pytestmark = pytest.mark.django_db

URL = "/api/v1/notifications"
VALID = {"channel": "email", "recipient": "ada@example.com", "subject": "Hi", "body": "Welcome"}


def post(api: APIClient, body: dict, key: str | None = "key-1", **headers):
    if key is not None:
        headers["HTTP_IDEMPOTENCY_KEY"] = key
    return api.post(URL, body, format="json", **headers)


def test_ids_are_uuid7_in_creation_order_single_and_batch(api, acme):
    """Ids grow with creation time (UUID version 7), so new rows sit together at the right
    edge of the primary key however large the history (notifications 0011)."""
    ids = []
    for n in range(3):
        response = post(api, VALID, key=f"order-{n}")
        assert response.status_code == 201
        ids.append(uuid.UUID(response.json()["id"]))
        time.sleep(0.002)  # the time part counts milliseconds
    batch = api.post(
        f"{URL}/batch",
        {"notifications": [{**VALID, "idempotency_key": f"batch-{n}"} for n in range(2)]},
        format="json",
    )
    assert batch.status_code == 200, batch.json()
    ids += [uuid.UUID(r["notification"]["id"]) for r in batch.json()["results"]]
    assert {i.version for i in ids} == {7}
    assert ids[:3] == sorted(ids[:3])
    assert max(ids[:3]) < min(ids[3:])
    milliseconds = [i.int >> 80 for i in ids]
    assert abs(milliseconds[0] / 1000 - time.time()) < 60


def test_create_answers_201_with_the_contract_representation(api, acme):
    response = post(
        api,
        {
            **VALID,
            "priority": "high",
            "channel": "EMAIL",
            "send_at": "2030-12-01T12:00:00+02:00",
            "metadata": {"order": "A-17"},
        },
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert set(body) == {
        "id", "status", "channel", "recipient", "priority", "send_at", "created_at",
        "updated_at", "attempt_count", "max_attempts", "last_error", "sent_at",
        "idempotency_key", "metadata", "user_id", "template", "fallback_channels",
        "operator_retries", "held_until", "held_reason", "receipt", "expires_at",
        "cancellation_key", "digest_bucket", "digest_id",
    }  # fmt: skip
    assert (body["held_until"], body["held_reason"]) == (None, None)  # a new row waits for nothing
    assert body["status"] == "PENDING"
    assert body["channel"] == "email"
    assert body["priority"] == "HIGH"
    assert body["send_at"] == "2030-12-01T10:00:00Z"
    assert body["created_at"].endswith("Z")
    assert body["attempt_count"] == 0
    assert body["max_attempts"] == 6
    assert body["last_error"] is None and body["sent_at"] is None
    assert body["idempotency_key"] == "key-1"
    assert body["metadata"] == {"order": "A-17"}
    assert (body["user_id"], body["template"]) == (None, None)
    assert (body["fallback_channels"], body["operator_retries"]) == ([], 0)
    row = Notification.objects.get(id=body["id"])
    assert row.client_id == acme[0].id
    assert row.priority == Priority.HIGH
    assert row.due_at == row.send_at == datetime(2030, 12, 1, 10, tzinfo=UTC)
    assert len(row.request_fingerprint) == 64


def test_max_attempts_comes_from_settings(api, settings):
    settings.NOTIFYQUEUE_MAX_ATTEMPTS = 3
    assert post(api, VALID).json()["max_attempts"] == 3


def test_no_timing_means_now_and_past_send_at_means_now(api):
    before = timezone.now()
    now_body = post(api, VALID, key="a").json()
    past_body = post(api, {**VALID, "send_at": "2001-01-01T00:00:00Z"}, key="b").json()
    for body in (now_body, past_body):
        send_at = datetime.fromisoformat(body["send_at"])
        assert before <= send_at <= timezone.now()


def test_delay_seconds_schedules_from_now(api):
    before = timezone.now()
    send_at = datetime.fromisoformat(post(api, {**VALID, "delay_seconds": 600}).json()["send_at"])
    assert before + timedelta(seconds=600) <= send_at <= timezone.now() + timedelta(seconds=600)


def test_same_key_same_request_answers_200_with_the_original(api):
    first = post(api, VALID)
    again = post(api, {**VALID, "channel": "Email"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == first.json()
    assert Notification.objects.count() == 1


def test_same_key_different_request_answers_409_and_changes_nothing(api):
    first = post(api, VALID)
    response = post(api, {**VALID, "body": "Something else"})
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "idempotency_key_reused"
    assert first.json()["id"] in error["message"]
    assert Notification.objects.get().body == "Welcome"


def test_idempotency_keys_are_scoped_per_client(api, make_client):
    _, other_key = make_client("globex")
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Api-Key {other_key}")
    assert post(api, VALID).status_code == 201
    assert post(other, {**VALID, "body": "different"}).status_code == 201
    assert Notification.objects.count() == 2


@pytest.mark.parametrize(
    "key, message",
    [
        (None, "required"),
        ("", "required"),
        ("a" * 256, "255"),
        ("caf\u00e9", "printable"),
    ],
)
def test_idempotency_key_header_is_validated(api, key, message):
    response = post(api, VALID, key=key)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert message in error["fields"]["Idempotency-Key"][0]
    assert Notification.objects.count() == 0


def test_idempotency_key_of_255_printable_characters_is_accepted(api):
    assert post(api, VALID, key="k" * 254 + "~").status_code == 201


INVALID = [
    ("channel", {**VALID, "channel": "pigeon"}),
    ("channel", {"recipient": "ada@example.com", "body": "x"}),
    ("recipient", {"channel": "email", "body": "x"}),
    ("send_at", {**VALID, "send_at": "tomorrow"}),
    ("send_at", {**VALID, "send_at": "2026-12-01T12:00:00"}),
    ("send_at", {**VALID, "send_at": 1764590400}),
    ("send_at", {**VALID, "send_at": "2026-13-01T12:00:00Z"}),
    ("delay_seconds", {**VALID, "send_at": "2026-12-01T12:00:00Z", "delay_seconds": 5}),
    ("delay_seconds", {**VALID, "delay_seconds": -1}),
    ("delay_seconds", {**VALID, "delay_seconds": 1.5}),
    ("delay_seconds", {**VALID, "delay_seconds": "5"}),
    ("delay_seconds", {**VALID, "delay_seconds": True}),
    ("delay_seconds", {**VALID, "delay_seconds": 10**12}),
    ("body", {**VALID, "body": "x" * 65_537}),
    ("body", {**VALID, "body": "é" * 32_769}),
    ("body", {"channel": "email", "recipient": "ada@example.com"}),
    ("body", {**VALID, "body": ""}),
    ("recipient", {**VALID, "recipient": "not-an-email"}),
    ("recipient", {**VALID, "channel": "sms", "recipient": "07700900123"}),
    ("recipient", {**VALID, "channel": "sms", "recipient": "+12345"}),
    ("recipient", {**VALID, "channel": "sms", "recipient": "+1234567890123456"}),
    ("recipient", {**VALID, "channel": "push", "recipient": "short"}),
    ("recipient", {**VALID, "channel": "push", "recipient": "has a space in it"}),
    ("recipient", {**VALID, "channel": "push", "recipient": "x" * 4097}),
    ("recipient", {**VALID, "channel": "in_app", "recipient": "u" * 256}),
    ("recipient", {**VALID, "channel": "in_app", "recipient": ""}),
    ("metadata", {**VALID, "metadata": ["not", "an", "object"]}),
    ("metadata", {**VALID, "metadata": "text"}),
    ("priority", {**VALID, "priority": "URGENT"}),
    ("colour", {**VALID, "colour": "blue"}),
    ("payload", {**VALID, "payload": {"name": "Ada"}}),
    ("body", {**VALID, "template": "welcome"}),
]


@pytest.mark.parametrize(
    "field, body", INVALID, ids=[f"{f}-{i}" for i, (f, _) in enumerate(INVALID)]
)
def test_invalid_requests_answer_400_naming_the_field_and_store_nothing(api, field, body):
    response = post(api, body)
    assert response.status_code == 400, response.json()
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert field in error["fields"], error
    assert error["message"]
    assert Notification.objects.count() == 0


def test_a_body_that_is_not_an_object_answers_400(api):
    response = api.post(URL, [VALID], format="json", HTTP_IDEMPOTENCY_KEY="k")
    assert response.status_code == 400
    assert "non_field_errors" in response.json()["error"]["fields"]


def test_malformed_json_answers_400(api):
    response = api.post(URL, "{nope", content_type="application/json", HTTP_IDEMPOTENCY_KEY="k")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "parse_error"


@pytest.mark.parametrize(
    "channel, recipient",
    [
        ("email", "ada@example.com"),
        ("sms", "+447700900123"),
        ("push", "fcm:APA91bH-" + "x" * 140),
        ("push", "t" * 4096),
        ("in_app", "user-42"),
    ],
)
def test_plausible_recipients_are_accepted(api, channel, recipient):
    response = post(api, {"channel": channel, "recipient": recipient, "body": "Hello"})
    assert response.status_code == 201, response.json()
    assert Notification.objects.get().recipient == recipient


def test_body_of_exactly_64_kib_is_accepted(api):
    assert post(api, {**VALID, "body": "é" * 32_768}).status_code == 201


def test_template_answers_unknown_template_naming_it(api):
    response = post(
        api,
        {"channel": "email", "recipient": "ada@example.com", "template": "order_shipped",
         "payload": {"order": "A-17"}},
    )  # fmt: skip
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "unknown_template"
    assert "order_shipped" in error["fields"]["template"][0]
    assert Notification.objects.count() == 0


def test_preference_mode_for_a_user_without_preferences_answers_422(api):
    response = post(api, {"user_id": "u-1", "template": "welcome", "payload": {}})
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "no_preferences"
    assert Notification.objects.count() == 0


def test_backlog_over_the_limit_answers_429_with_retry_after(api, acme, settings):
    settings.NOTIFYQUEUE_CLIENT_MAX_PENDING = 2
    NotificationFactory.create_batch(2, client=acme[0])
    NotificationFactory(client=acme[0], status=Status.SENT)
    assert post(api, VALID, key="third").status_code == 201
    response = post(api, VALID, key="fourth")
    assert response.status_code == 429
    assert response["Retry-After"] == "30"
    assert response.json()["error"]["code"] == "too_many_pending"
    assert Notification.objects.filter(idempotency_key="fourth").count() == 0
    # A replay is still answered.
    assert post(api, VALID, key="third").status_code == 200


def test_missing_api_key_answers_401(db):
    response = post(APIClient(), VALID)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "not_authenticated"
    assert Notification.objects.count() == 0


@pytest.mark.parametrize("header", ["Api-Key wrong.key", "Bearer abc", "Api-Key "])
def test_wrong_api_key_answers_401(db, header):
    http = APIClient()
    http.credentials(HTTP_AUTHORIZATION=header)
    response = post(http, VALID)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "authentication_failed"
