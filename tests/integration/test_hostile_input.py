"""Hostile input at the API, one step past the named bounds: control characters that end a
mail header line, templates that expand, values PostgreSQL or UTF-8 cannot hold, cursors of
the wrong type, and every JSON type in every field. Each is a 4xx naming the field (a batch
answers per item), never a 500, changes nothing, and logs none of the message's content.
Real HTTP stack, real PostgreSQL."""

from __future__ import annotations

import base64
import io
import json
import logging
import time
import tracemalloc

import pytest
from django.db import DataError, connection, transaction
from rest_framework.test import APIClient

from notifications.models import Notification
from preferences.models import UserPreferences
from templates.models import MessageTemplate
from tests.support.api_requests import URL, VALID, create, create_raw

pytestmark = pytest.mark.django_db

# Every character that ends a line for str.splitlines() or Python's mail package, and the
# other control characters but tab: none may be in an email subject given directly.
HEADER_BREAKS = [
    *(chr(c) for c in range(0x00, 0x20) if c not in (0x00, 0x09)),
    "\x7f",
    *(chr(c) for c in range(0x80, 0xA0)),
    "\u2028",
    "\u2029",
]


def error_of(response, status: int = 400) -> dict:
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    error = response.json()["error"]
    assert set(error) == {"code", "message", "fields"}
    return error


def put_template(http: APIClient, event: str, channel: str, subject: str, body: str):
    return http.put(
        f"/api/v1/templates/{event}/{channel}", {"subject": subject, "body": body}, format="json"
    )


# ------------------------------------------------------------------ email subjects


@pytest.mark.parametrize("char", HEADER_BREAKS, ids=lambda c: f"U+{ord(c):04X}")
def test_an_email_subject_with_a_control_character_or_line_separator_is_a_400(http, char):
    error = error_of(create(http, {**VALID, "subject": f"Hi{char}X-Evil: 1"}))
    assert list(error["fields"]) == ["subject"]
    batch = http.post(
        f"{URL}/batch",
        {
            "notifications": [
                {**VALID, "subject": f"Hi{char}X-Evil: 1", "idempotency_key": "bad"},
                {**VALID, "idempotency_key": "good"},
            ]
        },
        format="json",
    )
    assert [r["status"] for r in batch.json()["results"]] == [400, 201]
    assert list(batch.json()["results"][0]["error"]["fields"]) == ["subject"]
    assert list(Notification.objects.values_list("idempotency_key", flat=True)) == ["good"]


@pytest.mark.parametrize(
    "recipient",
    [
        '"a\x1cBcc:eve@example.com"@example.com',  # Django's validator takes a quoted \x1c
        '"a\x0cb"@example.com',
        '"a\x1db"@example.com',
        '"a\x7fb"@example.com',
        "ada@exa\u2028mple.com",
    ],
    ids=["quoted-x1c-bcc", "quoted-ff", "quoted-x1d", "quoted-del", "domain-u2028"],
)
def test_an_email_address_with_a_header_break_is_a_400_naming_the_recipient(http, recipient):
    error = error_of(create(http, {**VALID, "recipient": recipient}))
    assert list(error["fields"]) == ["recipient"]
    preferences = {"channels": ["email"], "addresses": {"email": recipient}}
    error = error_of(http.put("/api/v1/users/u-1/preferences", preferences, format="json"))
    assert "addresses" in error["fields"]
    assert not Notification.objects.exists() and not UserPreferences.objects.exists()


def test_a_tab_is_still_fine_in_an_email_subject(http):
    assert create(http, {**VALID, "subject": "Order\t17"}).status_code == 201


@pytest.mark.parametrize("char", ["\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\r\n"])
def test_an_email_template_subject_with_a_header_break_is_refused_when_saved(http, char):
    error = error_of(put_template(http, "welcome", "email", f"Hi{char}there", "b"))
    assert list(error["fields"]) == ["subject"]
    assert not MessageTemplate.objects.exists()


def test_header_breaks_from_a_payload_become_spaces_in_a_rendered_email_subject(http):
    assert put_template(http, "news", "email", "Re: {topic}", "Hello").status_code == 201
    topic = "a" + "".join(HEADER_BREAKS) + "z\tX-Evil: 1"
    body = {**VALID, "template": "news", "payload": {"topic": topic}}
    del body["subject"], body["body"]
    created = create(http, body)
    assert created.status_code == 201, created.content
    subject = Notification.objects.get().subject
    assert subject == "Re: a z\tX-Evil: 1"


# ------------------------------------------------------------------ template expansion


def test_a_template_that_would_expand_past_the_bound_is_refused_fast_and_small(http):
    """16,384 slots, each filled with a 64 KiB value: 1 GiB if it were built."""
    template = "{a}" * (64 * 1024 // 3)
    assert put_template(http, "bomb", "email", "s", template).status_code == 201
    body = {
        "channel": "email",
        "recipient": "ada@example.com",
        "template": "bomb",
        "payload": {"a": "x" * (64 * 1024 - 16)},
    }
    request = json.dumps(body)
    tracemalloc.start()
    try:
        started = time.monotonic()
        response = create_raw(http, request)
        elapsed = time.monotonic() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    error = error_of(response)
    assert error["fields"] == {
        "payload": [
            f"At most {64 * 1024} bytes of UTF-8 after rendering (this one would be "
            f"{(64 * 1024 // 3) * (64 * 1024 - 16)})."
        ]
    }
    assert elapsed < 2.0, elapsed
    assert peak < 32 * 1024 * 1024, peak
    assert not Notification.objects.exists()


# ------------------------------------------------------------------ values jsonb cannot hold

UNSTORABLE = {
    "surrogate-value": '{"note": "a\\ud800b"}',
    "surrogate-key": '{"a\\udfffb": 1}',
    "surrogate-deep": '{"x": [{"y": ["\\udbff"]}]}',
    "nan": '{"x": NaN}',
    "infinity": '{"x": Infinity}',
    "minus-infinity": '{"x": [-Infinity]}',
    "overflow": '{"x": 1e999}',
}


@pytest.mark.parametrize("field", ["metadata", "payload"])
@pytest.mark.parametrize("value", list(UNSTORABLE.values()), ids=list(UNSTORABLE))
def test_a_value_jsonb_cannot_hold_is_a_400_naming_the_field(http, field, value):
    if field == "payload":
        assert put_template(http, "welcome", "email", "Hi", "Hello").status_code == 201
        fields = '"channel": "email", "recipient": "ada@example.com", "template": "welcome"'
    else:
        fields = '"channel": "email", "recipient": "ada@example.com", "body": "b"'
    error = error_of(create_raw(http, f'{{{fields}, "{field}": {value}}}'))
    assert list(error["fields"]) == [field]

    items = (
        f'{{{fields}, "{field}": {value}, "idempotency_key": "bad"}}',
        f'{{{fields}, "idempotency_key": "good"}}',
    )
    batch = http.generic(
        "POST",
        f"{URL}/batch",
        f'{{"notifications": [{", ".join(items)}]}}',
        content_type="application/json",
    )
    assert batch.status_code == 200, batch.content[:300]
    results = batch.json()["results"]
    assert [r["status"] for r in results] == [400, 201]
    assert list(results[0]["error"]["fields"]) == [field]
    assert list(Notification.objects.values_list("idempotency_key", flat=True)) == ["good"]


# ------------------------------------------------------------------ cursors


def cursor_of(position) -> str:
    return base64.urlsafe_b64encode(json.dumps(position).encode()).decode().rstrip("=")


BAD_POSITIONS = {
    "i-number": {"d": "next", "t": "2026-01-01T00:00:00+00:00", "i": 17},
    "i-list": {"d": "next", "t": "2026-01-01T00:00:00+00:00", "i": [1, 2]},
    "i-object": {"d": "next", "t": "2026-01-01T00:00:00+00:00", "i": {"a": 1}},
    "i-null": {"d": "next", "t": "2026-01-01T00:00:00+00:00", "i": None},
    "t-number": {"d": "next", "t": 1767225600, "i": "018f3b6e-0000-7000-8000-000000000000"},
    "d-list": {"d": ["next"], "t": "2026-01-01T00:00:00+00:00", "i": "x"},
    "a-list": ["next", "2026-01-01T00:00:00+00:00"],
    "a-string": "next",
    "a-number": 17,
    "surrogate": {"d": "next", "t": "2026-01-01T00:00:00\ud800", "i": "x"},
}


@pytest.mark.parametrize("position", list(BAD_POSITIONS.values()), ids=list(BAD_POSITIONS))
@pytest.mark.parametrize("path", [URL, "/api/v1/users/u-1/inbox"])
def test_a_cursor_of_the_wrong_shape_is_a_400_naming_it(http, path, position):
    error = error_of(http.get(path, {"cursor": cursor_of(position)}))
    assert list(error["fields"]) == ["cursor"]


# ------------------------------------------------------------------ no content in the logs

SECRETS = ("SECRET-SUBJECT-7f3a", "SECRET-BODY-91c2", "secret-recipient-5d@example.com")


def hostile_requests(http: APIClient) -> list:
    subject, body, recipient = SECRETS
    base = (
        f'"channel": "email", "recipient": "{recipient}", "subject": "{subject}", "body": "{body}"'
    )
    answers = [
        create_raw(http, f'{{{base}, "metadata": {value}}}', key=f"k-{name}")
        for name, value in UNSTORABLE.items()
    ]
    answers.append(
        create(http, {**VALID, "recipient": recipient, "subject": f"{subject}\x0bX-Evil: 1"})
    )
    answers.append(
        http.generic(
            "POST",
            f"{URL}/batch",
            f'{{"notifications": [{{{base}, "metadata": {{"x": NaN}}, "idempotency_key": "b"}}]}}',
            content_type="application/json",
        )
    )
    for position in BAD_POSITIONS.values():
        answers.append(http.get(URL, {"cursor": cursor_of(position), "recipient": recipient}))
    return answers


def test_no_error_path_logs_message_content(http, caplog):
    """Every hostile request above, answered; then nothing in any log record names the
    recipient, subject or body they carried."""
    caplog.set_level(logging.DEBUG)
    answers = hostile_requests(http)
    assert {a.status_code for a in answers} <= {200, 400}
    logged = caplog.text + "".join(
        record.getMessage() + str(record.exc_info) for record in caplog.records
    )
    for secret in SECRETS:
        assert secret not in logged
    assert not Notification.objects.exists()


def test_a_database_error_is_logged_without_the_values_it_quotes():
    """The console handler's filter (notifyqueue/logformat.py): PostgreSQL quotes a failing
    statement's values in its error; the log keeps the class, SQLSTATE and frames only."""
    console = next(h for h in logging.getLogger().handlers if h.get_name() == "console")
    stream = io.StringIO()
    previous = console.setStream(stream)
    try:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT %s::text, %s::jsonb", [SECRETS[0], UNSTORABLE["nan"]])
        except DataError:
            logging.getLogger("django.request").exception("Internal Server Error: /api/v1/x")
    finally:
        console.setStream(previous)
    logged = stream.getvalue()
    assert "Internal Server Error" in logged
    assert "DataError (SQLSTATE 22P02)" in logged
    assert SECRETS[0] not in logged and "NaN" not in logged


# ------------------------------------------------------------------ every JSON type, every field

JSON_VALUES = {
    "null": None,
    "true": True,
    "false": False,
    "zero": 0,
    "negative": -1,
    "huge-int": 10**300,
    "float": 1.5,
    "empty-string": "",
    "string": "x",
    "spaces": "   ",
    "empty-list": [],
    "list": ["email", 1, None],
    "empty-object": {},
    "object": {"email": "ada@example.com", "a": [1, {"b": None}]},
}

CREATE_FIELDS = [
    "channel",
    "recipient",
    "subject",
    "body",
    "priority",
    "send_at",
    "delay_seconds",
    "metadata",
    "template",
    "payload",
    "user_id",
]


def assert_answered(response) -> int:
    """A deliberate answer: 2xx, or a 4xx in the JSON error format. Never a 5xx."""
    assert response.status_code < 500, response.content[:300]
    if response.status_code >= 400:
        error_of(response, response.status_code)
    return response.status_code


@pytest.mark.parametrize("value", list(JSON_VALUES.values()), ids=list(JSON_VALUES))
def test_every_json_type_in_every_create_field_is_answered(http, value):
    assert put_template(http, "welcome", "email", "Hi {name}", "Hello {name}").status_code == 201
    for index, field in enumerate(CREATE_FIELDS):
        body = {**VALID, field: value}
        if field in ("payload", "user_id"):
            body = {"channel": "email", "recipient": "ada@example.com", "template": "welcome"}
            body[field] = value
        status = assert_answered(create(http, body, key=f"single-{index}"))
        item = {**body, "idempotency_key": f"batch-{index}"}
        batch = http.post(f"{URL}/batch", {"notifications": [item]}, format="json")
        assert_answered(batch)
        if status >= 400:
            assert batch.json()["results"][0]["status"] == status
    for field_value in (value, [value], {"notifications": value}):
        assert_answered(http.post(f"{URL}/batch", field_value, format="json"))
    assert_answered(create(http, value, key="whole-body"))


@pytest.mark.parametrize("value", list(JSON_VALUES.values()), ids=list(JSON_VALUES))
def test_every_json_type_in_every_other_field_is_answered(http, value):
    for field in ("subject", "body"):
        template = {"subject": "s", "body": "b", field: value}
        assert_answered(http.put("/api/v1/templates/welcome/email", template, format="json"))
    preferences = {
        "channels": ["email"],
        "addresses": {"email": "ada@example.com"},
        "muted_events": [],
        "disabled_channels": [],
    }
    for field in preferences:
        assert_answered(
            http.put("/api/v1/users/u-1/preferences", {**preferences, field: value}, format="json")
        )
        assert_answered(
            http.put(
                "/api/v1/users/u-1/preferences",
                {**preferences, field: [value], "addresses": {"email": value}},
                format="json",
            )
        )
    for field in ("status", "channel"):
        assert_answered(
            http.post(f"{URL}/retry", {"status": "FAILED", field: value}, format="json")
        )
    for whole in (value, [value]):
        assert_answered(http.put("/api/v1/templates/welcome/email", whole, format="json"))
        assert_answered(http.put("/api/v1/users/u-1/preferences", whole, format="json"))


def test_preference_keys_and_lists_jsonb_cannot_hold_are_a_400(http):
    url = "/api/v1/users/u-1/preferences"
    base = '"channels": ["email"], "muted_events": [], "disabled_channels": []'
    for addresses in ('{"a\\ud800": "x"}', '{"email": "a\\ud800@example.com"}'):
        assert_answered(
            http.generic(
                "PUT", url, f'{{{base}, "addresses": {addresses}}}', content_type="application/json"
            )
        )
    muted = '"channels": ["email"], "addresses": {}, "disabled_channels": []'
    assert_answered(
        http.generic(
            "PUT",
            url,
            f'{{{muted}, "muted_events": ["a\\ud800"]}}',
            content_type="application/json",
        )
    )
    assert not UserPreferences.objects.exists()


@pytest.mark.parametrize("path", [URL, "/api/v1/templates/welcome/email"])
def test_a_key_utf8_cannot_hold_is_answered_escaped(http, path):
    method = "POST" if path == URL else "PUT"
    body = '{"channel": "email", "recipient": "ada@example.com", "body": "b", "a\\ud800": 1}'
    error = error_of(
        http.generic(method, path, body, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k")
    )
    assert "a\\ud800" in error["fields"]


HOSTILE_SEGMENTS = [
    "x",
    "0",
    "-1",
    "00000000-0000-0000-0000-000000000000",
    "%ED%A0%80",  # the UTF-8 bytes of a lone surrogate, which are not UTF-8
    "%FF%FE",
    "%E2%80%A8",  # U+2028
    "%0B%0C%1C%85",
    "..%2F..%2Fetc",
    "a" * 300,
    "%F0%9F%98%80",
    "1e999",
    "NaN",
]


@pytest.mark.parametrize("segment", HOSTILE_SEGMENTS)
def test_hostile_path_segments_and_query_values_are_answered(http, segment):
    requests = [
        ("GET", f"{URL}/{segment}"),
        ("POST", f"{URL}/{segment}/cancel"),
        ("POST", f"{URL}/{segment}/retry"),
        ("GET", f"{URL}/{segment}/attempts"),
        ("GET", f"/api/v1/users/{segment}/preferences"),
        ("GET", f"/api/v1/users/{segment}/inbox"),
        ("POST", f"/api/v1/users/u-1/inbox/{segment}/read"),
        ("GET", f"/api/v1/templates/{segment}/email"),
        ("GET", f"/api/v1/templates/welcome/{segment}"),
    ]
    for name in ("status", "channel", "recipient", "priority", "cursor", "page_size"):
        requests.append(("GET", f"{URL}?{name}={segment}"))
    for name in ("unread", "cursor", "page_size"):
        requests.append(("GET", f"/api/v1/users/u-1/inbox?{name}={segment}"))
    for method, path in requests:
        answer = http.generic(method, path)
        assert answer.status_code < 500, (method, path, answer.content[:200])
        if answer.status_code >= 400:
            error_of(answer, answer.status_code)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999", '"a\\ud800"'])
def test_json_literals_no_database_can_hold_in_every_create_field_are_answered(http, literal):
    """NaN, Infinity and 1e999 (which Python's parser reads, though they are not JSON) and a
    lone surrogate, in each field: a 400, single or in a batch; nothing stored."""
    assert put_template(http, "welcome", "email", "Hi {name}", "Hello {name}").status_code == 201
    for index, field in enumerate(CREATE_FIELDS):
        if field in ("payload", "user_id"):
            base = {"channel": "email", "recipient": "ada@example.com", "template": "welcome"}
        else:
            base = {"channel": "email", "recipient": "ada@example.com", "body": "b"}
        fields = ", ".join(f'"{k}": "{v}"' for k, v in base.items() if k != field)
        document = f'{{{fields}, "{field}": {literal}}}'
        status = assert_answered(create_raw(http, document, key=f"k-{index}"))
        assert status == 400, (field, literal)
        item = f'{{{fields}, "{field}": {literal}, "idempotency_key": "i-{index}"}}'
        batch = http.generic(
            "POST",
            f"{URL}/batch",
            f'{{"notifications": [{item}]}}',
            content_type="application/json",
        )
        assert_answered(batch)
        assert batch.json()["results"][0]["status"] == 400, (field, literal)
    assert not Notification.objects.exists()


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "1e999", '"a\\ud800"'])
def test_json_literals_no_database_can_hold_in_templates_and_preferences_are_a_400(http, literal):
    for field in ("subject", "body"):
        other = "body" if field == "subject" else "subject"
        answer = http.generic(
            "PUT",
            "/api/v1/templates/welcome/email",
            f'{{"{other}": "x", "{field}": {literal}}}',
            content_type="application/json",
        )
        assert field in error_of(answer)["fields"]
    channels = '"channels": ["email"], "disabled_channels": []'
    for document in (
        f'{{{channels}, "addresses": {{"email": {literal}}}, "muted_events": []}}',
        f'{{{channels}, "addresses": {{}}, "muted_events": [{literal}]}}',
    ):
        answer = http.generic(
            "PUT", "/api/v1/users/u-1/preferences", document, content_type="application/json"
        )
        error_of(answer)
    assert not MessageTemplate.objects.exists() and not UserPreferences.objects.exists()


HOSTILE_AUTHORIZATIONS = [
    "Api-Key",
    "Api-Key ",
    "Api-Key .",
    "Api-Key a.b.c",
    "Api-Key " + "a" * 5000,
    "Api-Key " + "é" * 20,  # latin-1 bytes in the header
    "Api-Key \x7f\x7f.\x7f",
    "api-key abc.def",
    "Bearer " + "b" * 300,
    "Basic YTpi",
]


@pytest.mark.parametrize("authorization", HOSTILE_AUTHORIZATIONS)
def test_hostile_authorization_headers_are_answered_401_or_less(authorization):
    http = APIClient()
    http.raise_request_exception = False
    headers = {"HTTP_AUTHORIZATION": authorization, "HTTP_IDEMPOTENCY_KEY": "k"}
    answers = [
        http.post(URL, VALID, format="json", **headers),
        http.post(f"{URL}/batch", {"notifications": [VALID]}, format="json", **headers),
        http.get(URL, **headers),
        http.get("/status", **headers),
        http.get("/metrics", **headers),
    ]
    for answer in answers:
        assert answer.status_code < 500, answer.content[:200]
    assert [a.status_code for a in answers[:3]] == [401, 401, 401]
    assert not Notification.objects.exists()


@pytest.mark.parametrize(
    "key", ["", " ", "k" * 256, "é", "a\tb", "a\x7fb", "\u2028"], ids=lambda k: repr(k)[:12]
)
def test_a_hostile_idempotency_key_is_a_400(http, key):
    answer = http.post(URL, VALID, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert answer.status_code == 400, answer.content[:200]
    item = {**VALID, "idempotency_key": key}
    batch = http.post(f"{URL}/batch", {"notifications": [item]}, format="json")
    assert batch.json()["results"][0]["status"] == 400
    assert not Notification.objects.exists()
