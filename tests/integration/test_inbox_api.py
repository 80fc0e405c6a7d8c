"""GET /api/v1/users/{user_id}/inbox and POST .../inbox/{id}/read."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from preferences.models import InboxMessage
from tests.integration.test_worker import drain
from tests.support.delivery_helpers import FakeClock, worker_build
from tests.support.factories import NotificationFactory

pytestmark = pytest.mark.django_db(transaction=True)


def message(client, user_id: str, minutes_ago: int, **fields) -> InboxMessage:
    notification = NotificationFactory(client=client, channel="in_app", recipient=user_id)
    return InboxMessage.objects.create(
        id=uuid.uuid4(),
        client=client,
        user_id=user_id,
        notification=notification,
        subject=f"{minutes_ago} minutes ago",
        body="Hello",
        created_at=timezone.now() - timedelta(minutes=minutes_ago),
        **fields,
    )


def test_in_app_notifications_reach_the_inbox_newest_first_and_are_marked_read(api):
    clock = FakeClock()
    worker = worker_build()
    try:
        for key, body in (("k-1", "first"), ("k-2", "second")):
            response = api.post(
                "/api/v1/notifications",
                {"channel": "in_app", "recipient": "u-1", "subject": body, "body": body},
                format="json",
                HTTP_IDEMPOTENCY_KEY=key,
            )
            assert response.status_code == 201
            drain(worker, clock)
            clock.advance(1)  # the inbox orders by delivery time
    finally:
        worker.stop()
        worker._shutdown()

    inbox = api.get("/api/v1/users/u-1/inbox").json()
    assert [m["body"] for m in inbox["results"]] == ["second", "first"]
    assert [m["read"] for m in inbox["results"]] == [False, False]
    assert inbox["next"] is None

    first = inbox["results"][1]
    read = api.post(f"/api/v1/users/u-1/inbox/{first['id']}/read")
    assert read.status_code == 200
    assert read.json()["read"] is True and read.json()["read_at"] is not None
    again = api.post(f"/api/v1/users/u-1/inbox/{first['id']}/read")
    assert again.json()["read_at"] == read.json()["read_at"]  # idempotent: first read kept
    unread = api.get("/api/v1/users/u-1/inbox?unread=true").json()["results"]
    assert [m["body"] for m in unread] == ["second"]


def test_inbox_pages_newest_first_by_cursor(api, acme):
    client = acme[0]
    for minutes in (5, 1, 3, 2, 4):
        message(client, "u-1", minutes)
    message(client, "u-2", 0)  # another user's message is not listed
    page = api.get("/api/v1/users/u-1/inbox?page_size=2").json()
    seen = [m["subject"] for m in page["results"]]
    while page["next"]:
        page = api.get(page["next"]).json()
        seen += [m["subject"] for m in page["results"]]
    assert seen == [f"{m} minutes ago" for m in (1, 2, 3, 4, 5)]


def test_inbox_refuses_a_forged_cursor_and_unknown_parameters(api):
    assert api.get("/api/v1/users/u-1/inbox?cursor=nonsense").status_code == 400
    assert api.get("/api/v1/users/u-1/inbox?colour=red").status_code == 400


def test_another_clients_message_cannot_be_listed_or_marked_read(api, make_client):
    other, other_key = make_client("other")
    theirs = message(other, "u-1", 1)
    assert api.get("/api/v1/users/u-1/inbox").json()["results"] == []
    response = api.post(f"/api/v1/users/u-1/inbox/{theirs.id}/read")
    assert response.status_code == 404
    theirs.refresh_from_db()
    assert theirs.read_at is None
    assert api.post("/api/v1/users/u-1/inbox/not-a-uuid/read").status_code == 404
    owner = APIClient()
    owner.credentials(HTTP_AUTHORIZATION=f"Api-Key {other_key}")
    assert owner.post(f"/api/v1/users/u-2/inbox/{theirs.id}/read").status_code == 404  # wrong user
    assert owner.post(f"/api/v1/users/u-1/inbox/{theirs.id}/read").status_code == 200


def test_inbox_page_reads_the_users_index_newest_first_without_a_scan_or_a_sort(acme):
    """Each page, of all messages or the unread ones, comes off an index in the page's order:
    its cost is the page's, not the user's history (before delivery 0011 a page of unread
    messages sorted all of the user's unread messages)."""
    from django.db import connection

    from preferences.repositories import SQL

    with connection.cursor() as cursor:
        cursor.execute(
            """
            WITH n AS (
                INSERT INTO notification (id, client_id, idempotency_key, request_fingerprint,
                    channel, recipient, subject, body, priority, metadata, fallback_channels,
                    status, send_at, due_at, attempt_count, max_attempts, operator_retries,
                    created_at, updated_at)
                SELECT gen_random_uuid(), %(client)s, 'bulk-' || g, '', 'in_app', 'u-' || g %% 50,
                    '', 'b', 2, '{}', '[]', 'SENT', now(), now(), 1, 6, 0, now(), now()
                FROM generate_series(1, 5000) AS g
                RETURNING id, recipient
            )
            INSERT INTO inbox_message (id, client_id, user_id, notification_id, subject, body,
                                       metadata, created_at)
            SELECT gen_random_uuid(), %(client)s, recipient, id, '', 'b', '{}',
                   now() - random() * interval '30 days'
            FROM n
            """,
            {"client": acme[0].id},
        )
        cursor.execute("ANALYZE inbox_message")
        for unread_only in (False, True):
            cursor.execute(
                "EXPLAIN " + SQL["inbox_page"],
                {
                    "client_id": acme[0].id,
                    "user_id": "u-7",
                    "unread_only": unread_only,
                    "after_created_at": timezone.now(),
                    "after_id": uuid.uuid4(),
                    "limit": 50,
                },
            )
            plan = "\n".join(row[0] for row in cursor.fetchall())
            assert "inbox_by_user" in plan or "inbox_unread" in plan, plan
            assert "Seq Scan on inbox_message" not in plan, plan
            assert "Sort" not in plan, plan


def test_a_clients_messages_are_found_by_the_inbox_index_and_no_index_is_the_client_alone(acme):
    # Every message writes an entry in each index: none is kept for what another's prefix serves.
    from django.db import connection

    message(acme[0], "u-1", 1)
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE tablename = 'inbox_message'")
        definitions = [row[0] for row in cursor.fetchall()]
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN SELECT id FROM inbox_message WHERE client_id = %s", [acme[0].id])
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert not [d for d in definitions if d.endswith("(client_id)")], definitions
    assert "inbox_by_user" in plan or "inbox_unread" in plan, plan
