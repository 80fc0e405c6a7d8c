"""A create's digest key over HTTP: its bounds and rules (400s naming the field, on the single,
batch and thin paths), the first of a window going at once and the rest collected, the
collected notification's bucket and close time in its representation, idempotency, and the
local time of day a `digest_at` window closes at. The close is in test_digests_delivery.py."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from rest_framework.test import APIClient

from notifications.models import DigestState, Notification, NotificationDigest, Status
from tests.support.clock import DbClock, database_now

pytestmark = pytest.mark.django_db

URL = "/api/v1/notifications"
EVENT = "comment"
DIGESTED = {
    "channel": "email",
    "recipient": "ada@example.com",
    "template": EVENT,
    "payload": {"who": "Bob"},
    "digest_key": "comments:post-1",
    "digest_window_seconds": 600,
}


@pytest.fixture
def templated(api: APIClient) -> APIClient:
    for channel in ("email", "sms"):
        response = api.put(
            f"/api/v1/templates/{EVENT}/{channel}",
            {
                "subject": "{who} commented" if channel == "email" else "",
                "body": "{digest_count} new:\n{digest_items}",
            },
            format="json",
        )
        assert response.status_code in (200, 201), response.json()
    return api


def post(api: APIClient, body: dict, key: str):
    return api.post(URL, body, format="json", HTTP_IDEMPOTENCY_KEY=key)


def iso(moment) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def test_the_first_of_a_window_goes_at_once_and_the_rest_wait_in_its_bucket(templated):
    clock = DbClock()
    first = post(templated, DIGESTED, "k-1")
    assert first.status_code == 201, first.json()
    body = first.json()
    # The first goes as a digest of itself: one item, its own line.
    row = Notification.objects.get(id=body["id"])
    assert (row.subject, row.body) == ("Bob commented", "1 new:\nBob commented")
    assert body["held_reason"] is None and body["digest_bucket"] is None
    assert row.due_at == clock.now
    bucket = NotificationDigest.objects.get()
    assert bucket.state == DigestState.OPEN and bucket.opened_by == row.id
    assert bucket.closes_at == clock.now + timedelta(seconds=600)

    clock.advance(60)
    second = post(templated, {**DIGESTED, "payload": {"who": "Cy"}}, "k-2")
    assert second.status_code == 201, second.json()
    held = second.json()
    assert held["status"] == Status.PENDING
    assert held["held_reason"] == "digest"
    assert held["held_until"] == iso(bucket.closes_at)
    assert held["digest_bucket"] == str(bucket.id)
    assert held["digest_id"] is None
    # The same in every read.
    read = templated.get(f"{URL}/{held['id']}").json()
    assert (read["held_reason"], read["digest_bucket"]) == ("digest", str(bucket.id))
    listed = templated.get(URL).json()["results"][0]
    assert (listed["id"], listed["held_reason"]) == (held["id"], "digest")
    bucket.refresh_from_db()
    assert bucket.collected == 1
    # A replay answers the same row, and collects nothing more.
    replay = post(templated, {**DIGESTED, "payload": {"who": "Cy"}}, "k-2")
    assert (replay.status_code, replay.json()["id"]) == (200, held["id"])
    reused = post(templated, {**DIGESTED, "payload": {"who": "Di"}}, "k-2")
    assert reused.status_code == 409
    bucket.refresh_from_db()
    assert bucket.collected == 1


def test_another_key_channel_or_recipient_is_another_bucket(templated):
    DbClock()
    answers = [
        post(templated, DIGESTED, "a"),
        post(templated, {**DIGESTED, "digest_key": "other"}, "b"),
        post(templated, {**DIGESTED, "recipient": "bo@example.com"}, "c"),
        post(templated, {**DIGESTED, "channel": "sms", "recipient": "+15551234567"}, "d"),
    ]
    assert [a.status_code for a in answers] == [201] * 4
    assert all(a.json()["held_reason"] is None for a in answers)
    assert NotificationDigest.objects.count() == 4


def test_a_create_after_the_window_ended_opens_the_next_window_and_goes_at_once(templated):
    clock = DbClock()
    post(templated, DIGESTED, "a")
    clock.advance(30)
    assert post(templated, DIGESTED, "b").json()["held_reason"] == "digest"
    clock.advance(600)
    late = post(templated, DIGESTED, "c").json()
    assert late["held_reason"] is None
    states = sorted(NotificationDigest.objects.values_list("state", flat=True))
    # The ended bucket is sealed for its close; the new window is open.
    assert states == [DigestState.CLOSING, DigestState.OPEN]


def test_the_batch_collects_as_single_creates_do(templated):
    DbClock()
    items = [{**DIGESTED, "idempotency_key": f"b-{i}"} for i in range(5)]
    response = templated.post(f"{URL}/batch", {"notifications": items}, format="json")
    assert response.status_code == 200, response.json()
    results = response.json()["results"]
    assert [r["status"] for r in results] == [201] * 5
    reasons = [r["notification"]["held_reason"] for r in results]
    assert reasons == [None, "digest", "digest", "digest", "digest"]
    assert NotificationDigest.objects.get().collected == 4


def test_in_preference_mode_the_user_is_the_recipient_and_digest_at_is_their_local_time(
    templated,
):
    response = templated.put(
        "/api/v1/users/u-1/preferences",
        {
            "channels": ["email"],
            "addresses": {"email": "u1@example.com"},
            "timezone": "Asia/Tokyo",
        },
        format="json",
    )
    assert response.status_code in (200, 201), response.json()
    # 23:30 in Tokyo: the next 09:00 there is 9.5 hours away.
    tokyo = ZoneInfo("Asia/Tokyo")
    start = datetime(2026, 12, 7, 23, 30, tzinfo=tokyo)
    clock = DbClock(start)
    request = {
        "user_id": "u-1",
        "template": EVENT,
        "payload": {"who": "Bob"},
        "digest_key": "daily",
        "digest_at": "09:00",
    }
    assert post(templated, request, "p-1").json()["held_reason"] is None
    clock.advance(3600)
    held = post(templated, request, "p-2").json()
    assert held["held_reason"] == "digest"
    closes = datetime(2026, 12, 8, 9, 0, tzinfo=tokyo).astimezone(ZoneInfo("UTC"))
    assert held["held_until"] == iso(closes)
    bucket = NotificationDigest.objects.get()
    assert (bucket.user_id, bucket.recipient) == ("u-1", "u1@example.com")


def test_digest_at_for_a_direct_recipient_is_utc(templated):
    clock = DbClock(datetime(2026, 12, 7, 10, 0, tzinfo=ZoneInfo("UTC")))
    body = {k: v for k, v in DIGESTED.items() if k != "digest_window_seconds"}
    assert post(templated, {**body, "digest_at": "09:30"}, "x").status_code == 201
    bucket = NotificationDigest.objects.get()
    assert bucket.closes_at == datetime(2026, 12, 8, 9, 30, tzinfo=ZoneInfo("UTC"))
    assert clock.now < bucket.closes_at


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"digest_window_seconds": -1}, "digest_window_seconds"),
        ({"digest_window_seconds": 0}, "digest_window_seconds"),
        ({"digest_window_seconds": 10**12}, "digest_window_seconds"),
        ({"digest_window_seconds": 1.5}, "digest_window_seconds"),
        ({"digest_window_seconds": "60"}, "digest_window_seconds"),
        ({"digest_at": "09:00"}, "digest_at"),  # both
        ({"digest_window_seconds": None, "digest_at": "9:00"}, "digest_at"),
        ({"digest_window_seconds": None, "digest_at": "24:00"}, "digest_at"),
        ({"digest_window_seconds": None, "digest_at": "09:00:00"}, "digest_at"),
        ({"digest_window_seconds": None, "digest_at": 900}, "digest_at"),
        ({"digest_window_seconds": None}, "digest_key"),  # neither
        ({"digest_key": "x" * 256}, "digest_key"),
        ({"digest_key": "a\u0000b"}, "digest_key"),
        ({"digest_key": "a\nb"}, "digest_key"),
        ({"digest_key": "\u00e9t\u00e9"}, "digest_key"),
        ({"digest_key": ""}, "digest_key"),
        ({"digest_key": None}, "digest_window_seconds"),  # a window without a key
        ({"delay_seconds": 10}, "delay_seconds"),
        ({"send_at": "2030-01-01T00:00:00Z"}, "send_at"),
    ],
)
def test_bad_digest_input_is_a_400_naming_the_field(templated, change, field):
    body = {k: v for k, v in ({**DIGESTED, **change}).items() if v is not None}
    response = post(templated, body, "bad")
    assert response.status_code == 400, response.json()
    assert field in response.json()["error"]["fields"], response.json()
    batch = templated.post(
        f"{URL}/batch", {"notifications": [{**body, "idempotency_key": "bad"}]}, format="json"
    )
    if "\u0000" in str(body.get("digest_key")):
        # The parser refuses a NUL anywhere in a body: the whole batch is the 400.
        assert batch.status_code == 400
    else:
        assert batch.status_code == 200
        (result,) = batch.json()["results"]
        assert result["status"] == 400 and field in result["error"]["fields"]
    assert not Notification.objects.exists()
    assert not NotificationDigest.objects.exists()


def test_a_digest_key_needs_a_template(api):
    body = {"channel": "email", "recipient": "a@example.com", "subject": "s", "body": "b"}
    response = post(api, {**body, "digest_key": "k", "digest_window_seconds": 60}, "t")
    assert response.status_code == 400
    assert "digest_key" in response.json()["error"]["fields"]


def test_nan_and_infinity_windows_are_refused(templated):
    for value in ("NaN", "Infinity", "1e999"):
        raw = (
            '{"channel": "email", "recipient": "a@example.com", "template": "comment", '
            '"payload": {"who": "x"}, "digest_key": "k", "digest_window_seconds": ' + value + "}"
        )
        response = templated.post(
            URL, raw, content_type="application/json", HTTP_IDEMPOTENCY_KEY="nan"
        )
        assert response.status_code == 400, (value, response.content)
    assert not Notification.objects.exists()
    assert math.isnan(float("nan"))


def test_the_database_clock_decides_the_window(templated):
    # The database is a day behind this process: the window counts from the database's now.
    clock = DbClock(database_now() - timedelta(days=1))
    post(templated, DIGESTED, "a")
    assert NotificationDigest.objects.get().closes_at == clock.now + timedelta(seconds=600)


def test_the_thin_path_and_the_drf_view_answer_a_digest_create_alike(templated):
    from tests.integration.test_api_thin_path import post as post_by
    from tests.integration.test_api_thin_path import same_answer

    DbClock()
    assert post_by(templated, URL, DIGESTED, key="open").status_code == 201
    # A collected create, then its replay by either path; a refusal by either path.
    held = post_by(templated, URL, DIGESTED, key="held")
    assert held.json()["held_reason"] == "digest"
    same_answer(
        post_by(templated, URL, DIGESTED, key="held"),
        post_by(templated, URL, DIGESTED, key="held", drf=True),
    )
    bad = {**DIGESTED, "digest_at": "09:00"}
    same_answer(
        post_by(templated, URL, bad, key="x"), post_by(templated, URL, bad, key="x", drf=True)
    )
    items = [{**DIGESTED, "idempotency_key": "held"}, {**DIGESTED, "idempotency_key": "b-2"}]
    batch_url = f"{URL}/batch"
    post_by(templated, batch_url, {"notifications": items})
    same_answer(
        post_by(templated, batch_url, {"notifications": items}),
        post_by(templated, batch_url, {"notifications": items}, drf=True),
    )


def test_a_collected_notification_cancelled_still_names_its_bucket(templated):
    DbClock()
    post(templated, DIGESTED, "open")
    held = post(templated, DIGESTED, "held").json()
    cancelled = templated.post(f"{URL}/{held['id']}/cancel")
    assert cancelled.status_code == 200, cancelled.json()
    body = cancelled.json()
    assert (body["status"], body["held_reason"]) == ("CANCELLED", None)
    assert body["digest_bucket"] == held["digest_bucket"]
