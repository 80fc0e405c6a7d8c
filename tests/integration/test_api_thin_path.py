"""The thin create path (notifications/ingest.py) answers exactly as the DRF views do.

`Accept: application/json; q=1` makes DRF's negotiation give the same JSON answer, but the thin
path does not take such a request: it goes through the DRF view. So the same request sent
with and without that header is answered once by each path, and the answers must be equal,
byte for byte and header for header.
"""

from __future__ import annotations

import json

import pytest
from rest_framework.test import APIClient

from notifications import ingest
from notifications.models import Status
from notifications.repositories import NotificationRepository
from notifications.serializers import NotificationOutput
from tests.support.factories import NotificationFactory

pytestmark = pytest.mark.django_db

URL = "/api/v1/notifications"
BATCH_URL = "/api/v1/notifications/batch"
VIA_DRF = {"HTTP_ACCEPT": "application/json; q=1"}
VALID = {
    "channel": "email",
    "recipient": "ada@example.com",
    "subject": "Hi",
    "body": "Grüße \u2028 line",
    "priority": "high",
    "send_at": "2030-12-01T12:00:00+02:00",
    "metadata": {"zeta": 1, "a": [1.5, None, "x"], "nested": {"b": True}},
}


def post(api: APIClient, url: str, body, *, key: str | None = None, drf: bool = False):
    headers = dict(VIA_DRF) if drf else {}
    if key is not None:
        headers["HTTP_IDEMPOTENCY_KEY"] = key
    return api.post(url, json.dumps(body), content_type="application/json", **headers)


def same_answer(thin, drf) -> None:
    assert thin.status_code == drf.status_code, (thin.content, drf.content)
    assert thin.content == drf.content
    assert dict(thin.headers) == dict(drf.headers)


def test_a_create_and_its_replay_answer_the_same_by_either_path(api):
    created = post(api, URL, VALID, key="k-1")
    assert created.status_code == 201
    thin_replay = post(api, URL, VALID, key="k-1")
    drf_replay = post(api, URL, VALID, key="k-1", drf=True)
    assert drf_replay.status_code == 200
    same_answer(thin_replay, drf_replay)
    assert thin_replay.content == created.content


def test_a_create_by_the_drf_view_replays_the_same_by_the_thin_path(api):
    created = post(api, URL, VALID, key="k-1", drf=True)
    assert created.status_code == 201
    same_answer(post(api, URL, VALID, key="k-1"), post(api, URL, VALID, key="k-1", drf=True))


@pytest.mark.parametrize(
    ("body", "key"),
    [
        ({**VALID, "channel": "fax"}, "k-1"),
        ({**VALID, "colour": "red"}, "k-1"),
        (VALID, None),
        (VALID, "é"),
        (["not", "an", "object"], "k-1"),
        ({**VALID, "priority": "CRITICAL"}, "k-1"),
        ({**VALID, "metadata": {"a": "\u0000"}}, "k-1"),
    ],
    ids=["bad channel", "unknown field", "no key", "bad key", "a list", "critical", "NUL"],
)
def test_refusals_answer_the_same_by_either_path(api, body, key):
    same_answer(post(api, URL, body, key=key), post(api, URL, body, key=key, drf=True))


def test_a_reused_key_answers_409_the_same_by_either_path(api):
    assert post(api, URL, VALID, key="k-1").status_code == 201
    other = {**VALID, "body": "different"}
    thin, drf = post(api, URL, other, key="k-1"), post(api, URL, other, key="k-1", drf=True)
    assert thin.status_code == 409
    same_answer(thin, drf)


def test_a_full_backlog_answers_429_the_same_by_either_path(api, settings):
    settings.NOTIFYQUEUE_CLIENT_MAX_PENDING = 0
    assert post(api, URL, VALID, key="k-0").status_code == 201  # 0 pending is not over 0
    thin, drf = post(api, URL, VALID, key="k-1"), post(api, URL, VALID, key="k-2", drf=True)
    assert thin.status_code == 429
    assert thin["Retry-After"] == "30"
    assert thin.content == drf.content and dict(thin.headers) == dict(drf.headers)


@pytest.mark.parametrize(
    "header",
    [None, "Api-Key nope.nope", "Bearer x", "Api-Key é.é"],
    ids=["none", "unknown key", "another scheme", "not ASCII"],
)
@pytest.mark.parametrize("url", [URL, BATCH_URL], ids=["create", "batch"])
def test_a_missing_or_bad_api_key_answers_401_the_same_by_either_path(acme, url, header):
    http = APIClient()
    if header is not None:
        http.credentials(HTTP_AUTHORIZATION=header)
    body = VALID if url == URL else {"notifications": [{**VALID, "idempotency_key": "b-1"}]}
    thin, drf = post(http, url, body, key="k-1"), post(http, url, body, key="k-1", drf=True)
    assert thin.status_code == 401
    same_answer(thin, drf)


def test_the_throttles_429_is_the_same_by_either_path(api, settings):
    settings.NOTIFYQUEUE_API_RATE_LIMIT = 1
    assert post(api, URL, VALID, key="k-1").status_code == 201
    thin, drf = post(api, URL, VALID, key="k-2"), post(api, URL, VALID, key="k-2", drf=True)
    assert thin.status_code == 429
    same_answer(thin, drf)


def test_a_batch_and_its_replay_answer_the_same_by_either_path(api):
    items = [
        {**VALID, "idempotency_key": "b-1"},
        {**VALID, "idempotency_key": "b-2", "channel": "fax"},
        {**VALID, "idempotency_key": "b-3", "priority": "CRITICAL"},
        {**VALID, "idempotency_key": "b-1"},
        {**VALID, "idempotency_key": "b-4", "body": 7},
        "not an object",
    ]
    created = post(api, BATCH_URL, {"notifications": items})
    assert [r["status"] for r in created.json()["results"]] == [201, 400, 403, 200, 201, 400]
    same_answer(
        post(api, BATCH_URL, {"notifications": items}),
        post(api, BATCH_URL, {"notifications": items}, drf=True),
    )


@pytest.mark.parametrize(
    "body",
    [
        {"notifications": []},
        {"notifications": [None]},
        {"notifications": [{**VALID, "idempotency_key": "b-1"}], "extra": 1},
        {"notifications": "nope"},
    ],
    ids=["empty", "a null item", "unknown field", "not a list"],
)
def test_batch_refusals_are_the_drf_views_own(api, body):
    same_answer(post(api, BATCH_URL, body), post(api, BATCH_URL, body, drf=True))


def test_the_representation_is_the_serializers(acme):
    rows = [
        NotificationFactory(client=acme[0]),
        NotificationFactory(
            client=acme[0],
            status=Status.DEAD_LETTERED,
            last_error="provider said no",
            user_id="u-1",
            template="signup",
            fallback_channels=["sms", "push"],
            metadata={"k": {"deep": [1, 2]}},
        ),
    ]
    repository = NotificationRepository()
    for row in rows:
        record = repository.get(notification_id=row.id, client_id=None)
        expected = NotificationOutput(record).data
        got = ingest.notification_representation(record)
        assert json.dumps(got) == json.dumps(expected)
