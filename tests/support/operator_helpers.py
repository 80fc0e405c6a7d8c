"""Rows for operator tests, made fast: thousands in one INSERT ... SELECT generate_series."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from django.db import connection
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
            SELECT gen_random_uuid(), %(client_id)s, 'bulk-' || gen_random_uuid() || '-' || n,
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
