"""GET one, the filtered keyset-paginated list, and cancel, against real PostgreSQL."""

from __future__ import annotations

from datetime import timedelta
from urllib.parse import parse_qs, urlparse

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from delivery.providers.simulated import SimulatedProvider
from notifications.models import Channel, Notification, Priority, Status
from ratelimits.services import RateLimit
from tests.support.delivery_helpers import worker_build
from tests.support.factories import NotificationFactory

pytestmark = pytest.mark.django_db

URL = "/api/v1/notifications"


@pytest.fixture
def other(make_client):
    client, key = make_client("globex")
    http = APIClient()
    http.credentials(HTTP_AUTHORIZATION=f"Api-Key {key}")
    return client, http


@pytest.fixture
def operator(make_client):
    _, key = make_client("ops", is_operator=True)
    http = APIClient()
    http.credentials(HTTP_AUTHORIZATION=f"Api-Key {key}")
    return http


def test_owner_reads_its_notification(api, acme):
    row = NotificationFactory(client=acme[0], priority=Priority.LOW, metadata={"a": 1})
    response = api.get(f"{URL}/{row.id}")
    assert response.status_code == 200
    body = response.json()
    assert (body["id"], body["priority"], body["metadata"]) == (str(row.id), "LOW", {"a": 1})


def test_another_clients_notification_is_not_found(api, other):
    row = NotificationFactory(client=other[0])
    response = api.get(f"{URL}/{row.id}")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize("notification_id", ["00000000-0000-0000-0000-000000000000", "nope"])
def test_unknown_or_malformed_id_is_not_found(api, notification_id):
    response = api.get(f"{URL}/{notification_id}")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_an_operator_reads_any_clients_notification(operator, other):
    row = NotificationFactory(client=other[0])
    assert operator.get(f"{URL}/{row.id}").status_code == 200


def test_reading_needs_an_api_key(acme):
    row = NotificationFactory(client=acme[0])
    assert APIClient().get(f"{URL}/{row.id}").status_code == 401
    assert APIClient().get(URL).status_code == 401


def make_rows(client, count, **fields):
    """Rows created one second apart, oldest first."""
    start = timezone.now() - timedelta(hours=1)
    return [
        NotificationFactory(client=client, created_at=start + timedelta(seconds=n), **fields)
        for n in range(count)
    ]


def ids(response) -> list[str]:
    return [item["id"] for item in response.json()["results"]]


def test_list_is_newest_first_and_only_the_clients_own(api, acme, other):
    rows = make_rows(acme[0], 3)
    make_rows(other[0], 2)
    response = api.get(URL)
    assert response.status_code == 200
    body = response.json()
    assert ids(response) == [str(r.id) for r in reversed(rows)]
    assert (body["next"], body["previous"]) == (None, None)


def test_an_operator_lists_every_client(operator, acme, other):
    make_rows(acme[0], 2)
    make_rows(other[0], 2)
    assert len(ids(operator.get(URL))) == 4


def test_list_walks_next_and_previous_by_cursor(api, acme):
    rows = make_rows(acme[0], 7)
    expected = [str(r.id) for r in reversed(rows)]
    first = api.get(URL, {"page_size": 3})
    assert ids(first) == expected[:3]
    assert first.json()["previous"] is None
    second = api.get(first.json()["next"])
    assert ids(second) == expected[3:6]
    # The cursor URL keeps the other parameters.
    assert parse_qs(urlparse(first.json()["next"]).query)["page_size"] == ["3"]
    third = api.get(second.json()["next"])
    assert ids(third) == expected[6:]
    assert third.json()["next"] is None
    back = api.get(third.json()["previous"])
    assert ids(back) == expected[3:6]
    start = api.get(back.json()["previous"])
    assert ids(start) == expected[:3]
    assert start.json()["previous"] is None


def test_list_pages_rows_with_the_same_created_at_by_id(api, acme):
    same = timezone.now()
    rows = [NotificationFactory(client=acme[0], created_at=same) for _ in range(5)]
    seen = []
    url, params = URL, {"page_size": 2}
    while url:
        response = api.get(url, params)
        seen += ids(response)
        url, params = response.json()["next"], None
    assert sorted(seen) == sorted(str(r.id) for r in rows)
    assert len(seen) == 5
    assert seen == sorted(seen, reverse=True)


def test_list_filters_combine(api, acme):
    wanted = NotificationFactory(
        client=acme[0],
        channel=Channel.SMS,
        recipient="+447700900123",
        priority=Priority.HIGH,
        status=Status.SENT,
    )
    NotificationFactory(client=acme[0], channel=Channel.SMS, recipient="+447700900123")
    NotificationFactory(client=acme[0], status=Status.SENT, priority=Priority.HIGH)
    query = {"status": "sent", "channel": "SMS", "recipient": "+447700900123", "priority": "high"}
    response = api.get(URL, query)
    assert response.status_code == 200
    assert ids(response) == [str(wanted.id)]
    assert len(ids(api.get(URL, {"status": "PENDING"}))) == 1
    assert len(ids(api.get(URL, {"recipient": "+447700900123"}))) == 2
    assert len(ids(api.get(URL, {"priority": "NORMAL"}))) == 1


@pytest.mark.parametrize(
    "params, field",
    [
        ({"status": "LOST"}, "status"),
        ({"channel": "pigeon"}, "channel"),
        ({"priority": "URGENT"}, "priority"),
        ({"page_size": "0"}, "page_size"),
        ({"page_size": "201"}, "page_size"),
        ({"page_size": "ten"}, "page_size"),
        ({"cursor": "garbage"}, "cursor"),
        ({"stauts": "SENT"}, "stauts"),
    ],
)
def test_list_rejects_bad_parameters(api, params, field):
    response = api.get(URL, params)
    assert response.status_code == 400
    assert field in response.json()["error"]["fields"]


def test_page_size_defaults_to_50_and_allows_200(api, acme):
    make_rows(acme[0], 201)
    first = api.get(URL)
    assert len(ids(first)) == 50
    assert first.json()["next"] is not None
    assert len(ids(api.get(URL, {"page_size": 200}))) == 200


def test_cancel_pending_answers_200_cancelled(api, acme):
    row = NotificationFactory(client=acme[0])
    response = api.post(f"{URL}/{row.id}/cancel")
    assert response.status_code == 200
    assert response.json()["status"] == "CANCELLED"
    row.refresh_from_db()
    assert row.status == Status.CANCELLED
    assert row.updated_at > row.created_at


@pytest.mark.parametrize(
    "status", [Status.SENT, Status.CANCELLED, Status.FAILED, Status.DEAD_LETTERED]
)
def test_cancel_of_a_final_notification_answers_409_and_changes_nothing(api, acme, status):
    row = NotificationFactory(client=acme[0], status=status)
    response = api.post(f"{URL}/{row.id}/cancel")
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "not_cancellable"
    assert status in error["message"]
    row.refresh_from_db()
    assert (row.status, row.updated_at) == (status, row.created_at)


def test_cancel_of_a_processing_notification_answers_409(api, acme):
    row = NotificationFactory(
        client=acme[0],
        status=Status.PROCESSING,
        claim_token="6f1c8e7a-1d52-4c0b-9a6e-4d1f0c3b2a19",
        claimed_by="worker-1",
        claim_expires_at=timezone.now() + timedelta(minutes=5),
    )
    assert api.post(f"{URL}/{row.id}/cancel").status_code == 409
    assert Notification.objects.get(id=row.id).status == Status.PROCESSING


def test_cancel_of_another_clients_notification_is_not_found(api, other):
    row = NotificationFactory(client=other[0])
    response = api.post(f"{URL}/{row.id}/cancel")
    assert response.status_code == 404
    assert Notification.objects.get(id=row.id).status == Status.PENDING


def test_cancel_needs_an_api_key(acme):
    row = NotificationFactory(client=acme[0])
    assert APIClient().post(f"{URL}/{row.id}/cancel").status_code == 401
    assert Notification.objects.get(id=row.id).status == Status.PENDING


@pytest.mark.django_db(transaction=True)
def test_a_row_the_rate_limit_deferred_shows_held_reason_and_until_and_a_sent_one_none(api, acme):
    """Two notifications to one recipient with a limit of one: the one sent shows no hold; the
    one deferred shows `held_reason` `rate_limit` and `held_until`, its next free slot (the
    due time the deferral gave it), in the read and in the list."""
    rows = [NotificationFactory(client=acme[0], recipient="ada@example.com") for _ in range(2)]
    worker = worker_build(
        providers={"email": SimulatedProvider()}, rate_limit=RateLimit(limit=1, window_s=600)
    )
    try:
        for _ in range(5):
            worker.run_once()
    finally:
        worker.stop()
        worker._shutdown()
    by_status = {
        row.status: row for row in Notification.objects.filter(id__in=[r.id for r in rows])
    }
    sent, deferred = by_status[Status.SENT], by_status[Status.PENDING]
    shown = api.get(f"{URL}/{sent.id}").json()
    assert (shown["held_until"], shown["held_reason"]) == (None, None)
    shown = api.get(f"{URL}/{deferred.id}").json()
    assert shown["held_reason"] == "rate_limit"
    assert shown["held_until"] == deferred.due_at.isoformat().replace("+00:00", "Z")
    assert shown["attempt_count"] == 0
    listed = {row["id"]: row for row in api.get(URL).json()["results"]}
    assert listed[str(deferred.id)]["held_reason"] == "rate_limit"
    assert listed[str(sent.id)]["held_reason"] is None
