"""Hostile input at the API: every bound is a 4xx in the JSON error format naming the field,
never a 500, and nothing is stored. Real HTTP stack, real PostgreSQL."""

from __future__ import annotations

import json

import psycopg
import pytest
from django.urls import get_resolver

from notifications.models import Notification
from notifyqueue.parsers import JSON_MAX_DEPTH
from preferences.models import UserPreferences
from templates.models import MessageTemplate
from tests.support.api_requests import URL, VALID, create, create_raw

pytestmark = pytest.mark.django_db


def error_of(response, status: int) -> dict:
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    error = response.json()["error"]
    assert set(error) == {"code", "message", "fields"}
    return error


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"subject": "s" * 999}, "subject"),
        ({"subject": "Hi\r\nBcc: everyone@example.com"}, "subject"),
        ({"subject": "Hi\nthere"}, "subject"),
        ({"body": "b" * (64 * 1024 + 1)}, "body"),
        ({"metadata": {"k": "v" * 16 * 1024}}, "metadata"),
        (
            {"metadata": {"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": {"i": 1}}}}}}}}}},
            "metadata",
        ),
        ({"recipient": "a" * 310 + "@example.com"}, "recipient"),
        ({"channel": "in_app", "recipient": "u" * 256}, "recipient"),
        ({"channel": "sms", "recipient": "+1" + "2" * 20}, "recipient"),
        ({"channel": "push", "recipient": "t" * 4097}, "recipient"),
        ({"send_at": "9999-12-31T23:59:59-05:00"}, "send_at"),
        ({"send_at": "0001-01-01T00:00:00+05:00"}, "send_at"),
        ({"send_at": "2999-01-01T00:00:00Z"}, "send_at"),
        ({"delay_seconds": 10**12}, "delay_seconds"),
    ],
    ids=[
        "subject-999",
        "subject-crlf",
        "subject-lf",
        "body-64KiB+1",
        "metadata-16KiB",
        "metadata-depth-9",
        "email-321",
        "in_app-256",
        "sms-22",
        "push-4097",
        "send_at-9999",
        "send_at-year-1",
        "send_at-past-10-years",
        "delay-huge",
    ],
)
def test_a_field_past_its_bound_is_a_400_naming_it(http, changes, field):
    error = error_of(create(http, {**VALID, **changes}), 400)
    assert field in error["fields"], error
    assert Notification.objects.count() == 0


def test_bounds_are_inclusive(http):
    at_limit = {
        **VALID,
        "subject": "s" * 998,
        "metadata": {"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": 1}}}}}}}},
    }
    assert create(http, at_limit).status_code == 201


def test_a_payload_past_its_bound_is_a_400_naming_it(http):
    body = {"user_id": "u1", "template": "welcome", "payload": {"name": "n" * 64 * 1024}}
    assert "payload" in error_of(create(http, body), 400)["fields"]


def test_line_breaks_are_fine_in_a_subject_that_is_not_a_mail_header(http):
    body = {"channel": "push", "recipient": "token-12345", "subject": "a\nb", "body": "x"}
    assert create(http, body).status_code == 201


@pytest.mark.parametrize(
    "body",
    [
        {**VALID, "metadata": {"note": "a\u0000b"}},
        {**VALID, "metadata": {"a\u0000b": 1}},
        {**VALID, "metadata": {"deep": [{"x": ["\u0000"]}]}},
        {"user_id": "u1", "template": "welcome", "payload": {"name": "\u0000"}},
        {**VALID, "body": "a\u0000"},
    ],
    ids=["metadata-value", "metadata-key", "metadata-nested", "payload", "body"],
)
def test_nul_anywhere_in_the_body_is_a_400(http, body):
    error = error_of(create(http, body), 400)
    assert "NUL" in error["message"]
    assert Notification.objects.count() == 0


def test_nul_in_a_batch_item_refuses_the_whole_batch_and_saves_nothing(http):
    items = [
        {**VALID, "idempotency_key": "one"},
        {**VALID, "idempotency_key": "two", "metadata": {"x": "\u0000"}},
    ]
    response = http.post(f"{URL}/batch", {"notifications": items}, format="json")
    error = error_of(response, 400)
    assert "notifications[1].metadata.x" in error["fields"]
    assert Notification.objects.count() == 0


def test_a_batch_item_that_is_not_an_object_is_that_items_400(http):
    items = [{**VALID, "idempotency_key": "one"}, "not an object", [1, 2]]
    response = http.post(f"{URL}/batch", {"notifications": items}, format="json")
    assert response.status_code == 200
    assert [r["status"] for r in response.json()["results"]] == [201, 400, 400]


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "/api/v1/users/a%00b/preferences"),
        ("put", "/api/v1/users/a%00b/preferences"),
        ("get", "/api/v1/users/a%00b/inbox"),
        ("get", "/api/v1/templates/a%00b/email"),
        ("put", "/api/v1/templates/a%00b/email"),
        ("get", "/api/v1/notifications?recipient=a%00b"),
        ("get", "/api/v1/users/u1/inbox?cursor=%00"),
    ],
)
def test_nul_in_the_path_or_query_is_a_400(http, method, path):
    body = {"channels": ["email"]} if "preferences" in path else {"body": "x"}
    response = getattr(http, method)(path, body if method == "put" else None, format="json")
    error_of(response, 400)
    assert not UserPreferences.objects.exists()
    assert not MessageTemplate.objects.exists()


def test_nul_in_a_header_is_a_400(http):
    error = error_of(create(http, VALID, key="a\x00b"), 400)
    assert "Idempotency-Key" in error["fields"]


def test_json_nested_100000_deep_is_a_400(http):
    error = error_of(create_raw(http, "[" * 100_000 + "]" * 100_000), 400)
    assert "nested" in error["message"]


def test_json_nested_just_past_the_documents_limit_is_a_400(http):
    depth = JSON_MAX_DEPTH + 1
    error_of(create_raw(http, '{"a":' * depth + "1" + "}" * depth), 400)


def test_an_oversized_body_is_a_413_in_the_json_format(http, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    response = create_raw(http, json.dumps({**VALID, "body": "x" * 20_000}))
    assert error_of(response, 413)["code"] == "payload_too_large"
    assert Notification.objects.count() == 0


def test_the_parser_reads_at_most_the_cap_whatever_the_length_header_says(settings):
    import io

    from notifyqueue.parsers import BoundedJSONParser, PayloadTooLarge

    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 100
    with pytest.raises(PayloadTooLarge):
        BoundedJSONParser().parse(io.BytesIO(b'{"a": "' + b"x" * 200 + b'"}'))


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("get", "/api/v1/notifications/", 404),
        ("post", "/api/v1/notifications/batch/", 404),
        ("get", "/api/v1/no-such-thing", 404),
        ("get", "/api/v1/notifications/not-a-uuid/attempts", 404),
        ("get", "/api/v1/notifications/3f6c2b0e-8d1a-4c57-9a51-0c4f1d7e2b90/attempts", 404),
        ("delete", "/api/v1/notifications", 405),
        ("patch", "/api/v1/templates/welcome/email", 405),
    ],
)
def test_every_error_under_api_is_json(http, method, path, status):
    error_of(getattr(http, method)(path), status)


def test_an_unexpected_500_under_api_is_json_without_details(rf):
    handler = get_resolver().resolve_error_handler(500)
    response = handler(rf.get("/api/v1/notifications"))
    assert response.status_code == 500
    assert json.loads(response.content)["error"]["code"] == "server_error"


def test_a_request_that_lost_its_database_session_is_a_503_to_retry(rf, database_url):
    """What psycopg raises for a session the server terminated, answered by the handler Django
    calls for an exception no view caught (the gunicorn test in test_create_combiner.py loses
    sessions mid-request)."""
    handler = get_resolver().resolve_error_handler(500)
    lost = psycopg.connect(database_url, autocommit=True)
    try:
        lost.execute("SELECT pg_terminate_backend(pg_backend_pid())")
    except psycopg.OperationalError:
        response = handler(rf.get("/api/v1/notifications"))
    finally:
        lost.close()
    assert response.status_code == 503
    assert response["Retry-After"] == "1"
    assert json.loads(response.content)["error"]["code"] == "database_unavailable"


def test_errors_outside_api_keep_djangos_pages(http):
    response = http.get("/no-such-page")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")


def test_template_subject_and_body_are_bounded(http):
    url = "/api/v1/templates/welcome/email"
    assert (
        "subject"
        in error_of(http.put(url, {"subject": "s" * 999, "body": "x"}, format="json"), 400)[
            "fields"
        ]
    )
    big = {"subject": "s", "body": "b" * (64 * 1024 + 1)}
    assert "body" in error_of(http.put(url, big, format="json"), 400)["fields"]


def test_user_ids_in_paths_are_bounded(http):
    for path in ("preferences", "inbox"):
        error = error_of(http.get(f"/api/v1/users/{'u' * 256}/{path}"), 400)
        assert "user_id" in error["fields"]


def test_list_cursor_is_bounded(http):
    error = error_of(http.get(URL, {"cursor": "c" * 2000}), 400)
    assert "cursor" in error["fields"]


def test_a_body_that_is_not_json_is_a_415_and_an_accept_without_json_a_406(http):
    error_of(
        http.generic("POST", URL, "a=b", content_type="text/plain", HTTP_IDEMPOTENCY_KEY="k"), 415
    )
    error_of(http.get(URL, HTTP_ACCEPT="text/html"), 406)


def test_a_subject_past_its_bound_after_rendering_is_a_400_naming_the_payload(http):
    template = {"subject": "Re: {topic}", "body": "Hello"}
    assert http.put("/api/v1/templates/news/email", template, format="json").status_code == 201
    body = {"channel": "email", "recipient": "ada@example.com", "template": "news"}
    ok = create(http, {**body, "payload": {"topic": "t" * 994}}, key="fits")
    assert ok.status_code == 201, ok.json()
    error = error_of(create(http, {**body, "payload": {"topic": "t" * 995}}, key="over"), 400)
    assert "payload" in error["fields"]
