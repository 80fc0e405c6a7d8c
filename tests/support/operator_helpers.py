"""Rows for operator tests, made fast: thousands in one INSERT ... SELECT generate_series; and
the check that an admin list reads a page of its table, not all of it."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone


def notifications_insert_bulk(
    *,
    client_id: uuid.UUID,
    count: int,
    status: str = "DEAD_LETTERED",
    channel: str = "email",
    start: datetime | None = None,
    attempt_count: int = 6,
    last_error: str | None = "provider answered 503: busy",
    recipient: str | None = None,
) -> None:
    """`count` rows of one status; row n is created n milliseconds after `start`, so the
    oldest-first order is the order of n. Each row has its own recipient unless one is given."""
    start = start or timezone.now() - timedelta(hours=1)
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO notification (
                id, client_id, idempotency_key, request_fingerprint, channel, recipient,
                subject, body, priority, metadata, fallback_channels, status, send_at, due_at,
                attempt_count, max_attempts, last_error, operator_retries, created_at, updated_at
            )
            SELECT notifyqueue_uuid7(), %(client_id)s, 'bulk-' || gen_random_uuid() || '-' || n,
                   md5(n::text), %(channel)s,
                   coalesce(%(recipient)s, 'user' || n || '@example.com'), 'Hi', 'Body', 2,
                   '{}'::jsonb, '[]'::jsonb, %(status)s,
                   %(start)s + n * interval '1 millisecond',
                   %(start)s + n * interval '1 millisecond',
                   %(attempts)s, 6, %(error)s, 0,
                   %(start)s + n * interval '1 millisecond',
                   %(start)s + n * interval '1 millisecond'
              FROM generate_series(1, %(count)s) AS n
            """,
            {
                "client_id": client_id,
                "count": count,
                "status": status,
                "channel": channel,
                "start": start,
                "attempts": attempt_count,
                "error": last_error,
                "recipient": recipient,
            },
        )


def events_insert_bulk(client_id: uuid.UUID, count: int) -> None:
    """`count` events for `client_id`, one a second back from now, every hundredth given up."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO webhook_event (id, client_id, notification_id, status, attempt_count,
                                       occurred_at, state, delivery_attempts, next_attempt_at,
                                       created_at)
            SELECT gen_random_uuid(), %s, gen_random_uuid(), 'SENT', 1,
                   now() - make_interval(secs => g),
                   CASE WHEN g %% 100 = 0 THEN 'FAILED' ELSE 'DELIVERED' END, 1, now(),
                   now() - make_interval(secs => g)
              FROM generate_series(1, %s) AS g
            """,
            [client_id, count],
        )
        cursor.execute("ANALYZE webhook_event")


def preferences_insert_bulk(client_id: uuid.UUID, count: int) -> None:
    """`count` users of `client_id`, `user-1` … `user-<count>`."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO user_preferences (id, client_id, user_id, channels, addresses,
                                          muted_events, disabled_channels, created_at,
                                          updated_at)
            SELECT gen_random_uuid(), %s, 'user-' || g, '["email"]',
                   '{"email": "u@example.com"}', '[]', '[]', now(), now()
              FROM generate_series(1, %s) AS g
            """,
            [client_id, count],
        )
        cursor.execute("ANALYZE user_preferences")


def changelist_page(operator, url: str, query: dict, table: str):
    """An admin list page as `operator` gets it, checked to be read as a page of `table`: no
    full `COUNT(*)` (the estimated-count paginator), no `SELECT DISTINCT` over the table (a
    filter's choices read from it), and a plan that neither scans nor sorts it. The clients
    joined to the page may be read whole: a small table, whose statistics move with the other
    tests' clients. Returns the page's rows and its plan."""
    with CaptureQueriesContext(connection) as queries:
        response = operator.get(url, query)
    assert response.status_code == 200
    statements = [q["sql"].upper() for q in queries.captured_queries]
    assert not [s for s in statements if s.startswith("SELECT COUNT(*) AS")], statements
    assert not [s for s in statements if "DISTINCT" in s and table.upper() in s], statements
    changelist = response.context["cl"]
    assert changelist.sortable_by == (), "a column's sort would read the whole table"
    page = changelist.result_list
    plan = page.explain()
    assert f"Seq Scan on {table}" not in plan, plan
    return page, plan
