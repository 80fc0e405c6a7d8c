"""Quiet hours through the API and the real worker on real PostgreSQL, the database's clock
moved by DbClock: a notification for a user that falls due inside one of the user's windows
stays PENDING, held until the window's end in the user's zone, without using an attempt, and
goes then; CRITICAL notifications and direct recipients are never held; a change of the
user's zone or windows re-times what is held at once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction
from rest_framework.test import APIClient

from delivery.models import DeliveryAttempt, SimulatedProviderMessage
from delivery.repositories import DeliveryRepository
from notifications.models import Notification, Status
from preferences.models import UserPreferences
from tests.support.clock import DbClock
from tests.support.delivery_helpers import step_until_idle, worker_build
from tests.support.factories import ClientFactory
from tests.support.reads import pages_visited_by_relation

pytestmark = pytest.mark.django_db(transaction=True)

PAYLOAD = {"order": "A-17"}
NIGHT = {"start": "22:00", "end": "07:30"}


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.fixture
def api(make_client) -> APIClient:
    _, key = make_client("shop", may_send_critical=True)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Api-Key {key}")
    for channel in ("email", "sms"):
        response = api.put(
            f"/api/v1/templates/order_shipped/{channel}",
            {"subject": "Shipped", "body": "{order} shipped"},
            format="json",
        )
        assert response.status_code == 201
    return api


@pytest.fixture
def worker():
    built = worker_build()
    yield built
    built.stop()
    built._shutdown()


def preferences_put(api: APIClient, user: str = "u-1", **fields) -> dict:
    body = {"channels": ["email", "sms"], "addresses": {"email": f"{user}@example.com"}, **fields}
    response = api.put(f"/api/v1/users/{user}/preferences", body, format="json")
    assert response.status_code in (200, 201), response.json()
    return response.json()


def create(api: APIClient, key: str, user: str = "u-1", **fields) -> str:
    body = {"user_id": user, "template": "order_shipped", "payload": PAYLOAD, **fields}
    response = api.post("/api/v1/notifications", body, format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def shown(api: APIClient, notification_id: str) -> dict:
    response = api.get(f"/api/v1/notifications/{notification_id}")
    assert response.status_code == 200
    return response.json()


def held(api: APIClient, notification_id: str) -> tuple:
    body = shown(api, notification_id)
    return body["status"], body["held_reason"], body["held_until"], body["attempt_count"]


def sends() -> int:
    return SimulatedProviderMessage.objects.count()


def window(start: str, end: str) -> dict:
    return {"start": start, "end": end}


# (zone, window, a moment inside it, its end: each on a night the zone's clocks change)
CHANGE_NIGHTS = [
    ("Europe/Berlin", NIGHT, "2026-03-28 23:30", "2026-03-29T05:30:00Z"),
    ("Europe/Berlin", NIGHT, "2026-10-24 21:00", "2026-10-25T06:30:00Z"),
    ("America/New_York", window("23:00", "06:00"), "2026-03-08 04:30", "2026-03-08T10:00:00Z"),
    ("America/New_York", window("23:00", "06:00"), "2026-11-01 03:30", "2026-11-01T11:00:00Z"),
    ("Australia/Lord_Howe", window("22:00", "02:15"), "2026-10-03 12:00", "2026-10-03T15:30:00Z"),
    ("Australia/Lord_Howe", window("22:00", "01:45"), "2026-04-04 15:05", "2026-04-04T15:15:00Z"),
    ("Asia/Kathmandu", window("21:00", "06:15"), "2026-12-07 16:00", "2026-12-08T00:30:00Z"),
]


@pytest.mark.parametrize(
    ("zone", "window", "inside", "end"),
    CHANGE_NIGHTS,
    ids=[f"{zone} {inside[:10]}" for zone, _, inside, _ in CHANGE_NIGHTS],
)
def test_a_notification_due_in_a_window_waits_until_its_end_in_the_users_time_and_goes_then(
    api, worker, zone, window, inside, end
):
    clock = DbClock(utc(inside))
    preferences_put(api, timezone=zone, quiet_hours=[window])
    notification = create(api, "k-1")

    step_until_idle(worker)

    assert held(api, notification) == ("PENDING", "quiet_hours", end, 0)
    assert DeliveryAttempt.objects.filter(notification_id=notification).count() == 0
    assert sends() == 0
    clock.now = datetime.fromisoformat(end) - timedelta(seconds=1)
    step_until_idle(worker)
    assert held(api, notification)[:2] == ("PENDING", "quiet_hours")

    clock.now = datetime.fromisoformat(end)
    step_until_idle(worker)
    body = shown(api, notification)
    assert (body["status"], body["held_reason"], body["attempt_count"]) == ("SENT", None, 1)
    assert body["sent_at"] == end
    assert sends() == 1


def test_critical_notifications_and_direct_recipients_ignore_quiet_hours(api, worker):
    DbClock(utc("2026-12-07 23:00"))
    preferences_put(api, timezone="Europe/Berlin", quiet_hours=[NIGHT])
    critical = create(api, "k-critical", priority="CRITICAL")
    direct = api.post(
        "/api/v1/notifications",
        {"channel": "email", "recipient": "u-1@example.com", "subject": "s", "body": "b"},
        format="json",
        HTTP_IDEMPOTENCY_KEY="k-direct",
    ).json()["id"]
    normal = create(api, "k-normal")

    step_until_idle(worker)

    assert shown(api, critical)["status"] == "SENT"
    assert shown(api, direct)["status"] == "SENT"
    assert held(api, normal)[:2] == ("PENDING", "quiet_hours")


def test_a_window_holds_only_its_channels(api, worker):
    DbClock(utc("2026-12-07 23:00"))
    preferences_put(
        api, timezone="Europe/Berlin", quiet_hours=[{**NIGHT, "channels": ["sms", "push"]}]
    )
    notification = create(api, "k-1")
    step_until_idle(worker)
    assert shown(api, notification)["status"] == "SENT"


def test_a_window_removed_while_a_notification_waits_lets_it_go_at_once(api, worker):
    clock = DbClock(utc("2026-12-07 23:00"))
    preferences_put(api, timezone="Europe/Berlin", quiet_hours=[NIGHT])
    notification = create(api, "k-1")
    step_until_idle(worker)
    assert held(api, notification)[2] == "2026-12-08T06:30:00Z"

    clock.advance(60)
    preferences_put(api, timezone="Europe/Berlin", quiet_hours=[])

    row = Notification.objects.get(id=notification)
    assert (row.status, row.due_at, row.quiet_held_since) == (Status.PENDING, clock.now, None)
    assert shown(api, notification)["held_reason"] is None
    step_until_idle(worker)
    assert shown(api, notification)["status"] == "SENT"


def test_a_timezone_changed_mid_wait_re_times_the_hold_to_the_new_zone(api, worker):
    clock = DbClock(utc("2026-12-07 23:00"))  # 00:00 in Berlin, 18:00 in New York
    preferences_put(api, timezone="Europe/Berlin", quiet_hours=[{"start": "23:00", "end": "07:30"}])
    notification = create(api, "k-1")
    step_until_idle(worker)
    assert held(api, notification)[2] == "2026-12-08T06:30:00Z"

    # Tokyo: 08:00, outside the window: it goes now.
    clock.advance(60)
    preferences_put(api, timezone="Asia/Tokyo", quiet_hours=[{"start": "23:00", "end": "07:30"}])
    assert Notification.objects.get(id=notification).due_at == clock.now
    assert shown(api, notification)["held_reason"] is None

    # Back in a window before the worker came round: held again, in the zone it now has.
    preferences_put(api, timezone="Asia/Kolkata", quiet_hours=[{"start": "04:00", "end": "07:30"}])
    step_until_idle(worker)
    # 23:01 UTC is 04:31 in Kolkata (+05:30): held until 07:30 there, 02:00 UTC.
    assert held(api, notification) == ("PENDING", "quiet_hours", "2026-12-08T02:00:00Z", 0)

    # A new zone while it is held: still inside, re-timed in place to the new window's end.
    preferences_put(
        api, timezone="Asia/Kathmandu", quiet_hours=[{"start": "04:00", "end": "07:30"}]
    )
    assert held(api, notification) == ("PENDING", "quiet_hours", "2026-12-08T01:45:00Z", 0)
    clock.now = utc("2026-12-08 01:45")
    step_until_idle(worker)
    assert shown(api, notification)["status"] == "SENT"


def test_a_window_changed_while_a_notification_waits_applies_at_the_next_claim(api, worker):
    """A change while the row is claimed (not yet held) is read by the stage itself."""
    clock = DbClock(utc("2026-12-07 23:00"))
    preferences_put(api, timezone="Europe/Berlin", quiet_hours=[NIGHT])
    early = create(api, "k-early")
    step_until_idle(worker)
    preferences_put(api, timezone="Europe/Berlin", quiet_hours=[{"start": "22:00", "end": "06:00"}])
    assert held(api, early)[2] == "2026-12-08T05:00:00Z"
    clock.now = utc("2026-12-08 05:00")
    step_until_idle(worker)
    assert shown(api, early)["status"] == "SENT"


def test_a_held_notification_keeps_all_its_attempts_through_many_holds(api, worker):
    """Held night after night (a window every night, a notification retried into it), it never
    runs out of attempts: each hold gives its attempt back."""
    clock = DbClock(utc("2026-12-07 23:00"))
    preferences_put(api, timezone="UTC", quiet_hours=[{"start": "22:00", "end": "23:30"}])
    notification = create(api, "k-1")
    for _ in range(10):  # more holds than max_attempts
        step_until_idle(worker)
        assert held(api, notification)[3] == 0
        preferences_put(api, timezone="UTC", quiet_hours=[{"start": "22:00", "end": "23:30"}])
        with connection.cursor() as cursor:  # due again inside the window, as a retry would be
            cursor.execute(
                "UPDATE notification SET due_at = notifyqueue_now() WHERE id = %s", [notification]
            )
    clock.now = utc("2026-12-07 23:30")
    step_until_idle(worker)
    assert shown(api, notification)["status"] == "SENT"


def test_deleting_the_users_preferences_lets_the_held_rows_go(api, worker):
    clock = DbClock(utc("2026-12-07 23:00"))
    preferences_put(api, timezone="Europe/Berlin", quiet_hours=[NIGHT])
    notification = create(api, "k-1")
    step_until_idle(worker)
    UserPreferences.objects.filter(user_id="u-1").delete()
    row = Notification.objects.get(id=notification)
    assert (row.due_at, row.quiet_held_since) == (clock.now, None)
    step_until_idle(worker)
    assert shown(api, notification)["status"] == "SUPPRESSED"  # no preferences: no channel


def test_a_notification_released_from_quiet_hours_then_retried_shows_no_hold(api, worker):
    """Passing the stage clears the mark: a later retry's wait is not shown as quiet hours."""
    clock = DbClock(utc("2026-12-07 23:00"))
    preferences_put(
        api,
        addresses={"email": "u-1-flaky-1@example.com"},  # the simulated provider fails it once
        timezone="Europe/Berlin",
        quiet_hours=[NIGHT],
    )
    notification = create(api, "k-1")
    step_until_idle(worker)
    assert held(api, notification)[1] == "quiet_hours"
    clock.now = utc("2026-12-08 06:30")
    step_until_idle(worker)
    status, reason, until, attempts = held(api, notification)
    assert (status, reason, until, attempts) == ("PENDING", None, None, 1)
    assert Notification.objects.get(id=notification).quiet_held_since is None


def test_the_stage_and_the_re_time_read_only_the_users_rows_whatever_is_held_for_others(api):
    """With 20,000 rows of other users held, a user's change of windows and the stage's
    statement visit about as many pages as with as many rows held by none: the change finds the
    user's held rows through notification_quiet_held, the stage reads its claims by key."""
    from tests.support.operator_helpers import notifications_insert_bulk

    DbClock(utc("2026-12-07 23:00"))
    # The indexes as deep in both runs: as many rows that are not held.
    notifications_insert_bulk(client_id=ClientFactory().id, count=20_000, status="SENT")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE notification")
    preferences_put(api, timezone="Europe/Berlin", quiet_hours=[NIGHT])
    repo = DeliveryRepository()

    def change_and_hold() -> dict[str, int]:
        create(api, f"k-{datetime.now().timestamp()}")
        claims = repo.notification_claim_due(worker="w", limit=1, claim_timeout_s=30)
        with transaction.atomic():
            before = pages_visited_by_relation()
            assert len(repo.notification_quiet_hold(claims)) == 1
            preferences_put(api, timezone="Europe/Paris", quiet_hours=[NIGHT])
            preferences_put(api, timezone="Europe/Berlin", quiet_hours=[NIGHT])
            after = pages_visited_by_relation()
        return {name: after[name] - before.get(name, 0) for name in after}

    quiet = change_and_hold()
    held_rows_insert(ClientFactory().id, 20_000, due_at=utc("2026-12-08 06:30"))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE notification")
    busy = change_and_hold()
    grown = {
        name: (quiet.get(name, 0), pages)
        for name, pages in busy.items()
        if pages > quiet.get(name, 0)
    }
    # Deeper indexes cost a page or two a look-up; reading the 20,000 held rows would cost
    # thousands (their heap alone is over 600 pages).
    assert sum(busy.values()) <= 1.5 * sum(quiet.values()) + 20, sorted(grown.items())
    # Whatever planning reads of each partition's indexes, the held rows' heap (over 600
    # pages) is never read.
    assert busy["notification"] < 100, sorted(grown.items())
    print(
        f"hold and two changes: {sum(quiet.values())} pages, {sum(busy.values())} with 20,000 held"
    )


def held_rows_insert(client_id, count: int, *, due_at: datetime) -> None:
    """`count` PENDING rows of as many users, each held by quiet hours until `due_at`."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO notification (
                id, client_id, idempotency_key, request_fingerprint, channel, recipient,
                subject, body, priority, metadata, fallback_channels, status, send_at, due_at,
                attempt_count, max_attempts, operator_retries, created_at, updated_at, user_id,
                template, quiet_held_since
            )
            SELECT gen_random_uuid(), %(client_id)s, 'held-' || n, md5(n::text), 'email',
                   'user' || n || '@example.com', 'Hi', 'Body', 2, '{}'::jsonb, '[]'::jsonb,
                   'PENDING', notifyqueue_now(), %(due_at)s, 0, 6, 0, notifyqueue_now(),
                   notifyqueue_now(), 'user-' || n, 'order_shipped', notifyqueue_now()
              FROM generate_series(1, %(count)s) AS n
            """,
            {"client_id": client_id, "count": count, "due_at": due_at},
        )


def test_a_claim_reads_none_of_100000_held_rows():
    """Held rows are not due until their window ends, so the claim never reads them: a claim
    of 100 due rows reads as many heap pages of the record and the queue behind 100,000 held
    rows as behind none (2,108 pages in all with none held, 3,071 with 100,000: the difference
    is the deeper primary keys, two more levels for each row claimed, and one more level of
    queue_pending_client for each client it steps through)."""
    from tests.support.operator_helpers import notifications_insert_bulk

    DbClock(utc("2026-12-07 23:00"))
    repo = DeliveryRepository()

    def claim_pages() -> dict[str, int]:
        notifications_insert_bulk(
            client_id=ClientFactory().id, count=100, status="PENDING", attempt_count=0,
            start=utc("2026-12-07 22:00"),
        )  # fmt: skip
        with connection.cursor() as cursor:
            for table in ("notification", "notification_queue", "delivery_attempt"):
                cursor.execute(f"ANALYZE {table}")
        with transaction.atomic():
            before = pages_visited_by_relation()
            claims = repo.notification_claim_due(worker="w", limit=100, claim_timeout_s=30)
            after = pages_visited_by_relation()
        assert len(claims) == 100
        with connection.cursor() as cursor:
            cursor.execute("UPDATE notification SET status = 'SENT', sent_at = now(), "
                           "claim_token = NULL, claim_expires_at = NULL "
                           "WHERE status = 'PROCESSING'")  # fmt: skip
        return {name: int(after[name] - before.get(name, 0)) for name in after}

    none_held = claim_pages()
    held_rows_insert(ClientFactory().id, 100_000, due_at=utc("2026-12-08 06:30"))
    many_held = claim_pages()
    for heap in ("notification", "notification_queue"):
        assert many_held[heap] <= none_held[heap] + 20, (heap, none_held, many_held)
    assert many_held["queue_pending_client"] <= 200, many_held
    assert sum(many_held.values()) <= 1.6 * sum(none_held.values()), (none_held, many_held)


def test_metrics_count_the_rows_held_by_each_reason(api, worker):
    DbClock(utc("2026-12-07 23:00"))
    preferences_put(api, timezone="Europe/Berlin", quiet_hours=[NIGHT])
    create(api, "k-1")
    create(api, "k-2")
    step_until_idle(worker)
    body = APIClient().get("/metrics").content.decode()
    assert 'notifyqueue_notifications_held{reason="quiet_hours"} 2.0' in body
    assert 'notifyqueue_notifications_held{reason="rate_limit"} 0.0' in body
    assert 'notifyqueue_notifications_held{reason="circuit_open"} 0.0' in body
