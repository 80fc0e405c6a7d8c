"""The queue tables (notification_queue, webhook_queue) against the records they copy, for tests
that check the two agree after writes and faults."""

from __future__ import annotations

from django.db import connection

COPIED = (
    "id, client_id, status, priority, channel, due_at, created_at, claim_expires_at, expires_at"
)
QUEUE_COLUMNS = f"{COPIED}, claimed_by, recipient_digest, cancellation_digest"
# The record's values for the queue's columns.
RECORD_COLUMNS = (
    f"{COPIED}, CASE WHEN status = 'PROCESSING' THEN claimed_by END, "
    "CASE WHEN status = 'PENDING' THEN md5(recipient)::uuid END, md5(cancellation_key)::uuid"
)


def queue_differences() -> list[tuple]:
    """Rows the record has and the queue lacks, or the other way round, compared on every
    queue column (the record's SENT rows excluded: they have no queue row). Empty when the
    queue is exactly the record's copy."""
    record = f"SELECT {RECORD_COLUMNS} FROM notification WHERE status <> 'SENT'"
    queue = f"SELECT {QUEUE_COLUMNS} FROM notification_queue"
    with connection.cursor() as cursor:
        cursor.execute(f"({record} EXCEPT ALL {queue}) UNION ALL ({queue} EXCEPT ALL {record})")
        return cursor.fetchall()


WEBHOOK_COPIED = "id, client_id, state, next_attempt_at, created_at, claim_expires_at"


def webhook_queue_differences() -> list[tuple]:
    """`queue_differences` for webhook_queue against webhook_event's events not yet final."""
    events = (
        f"SELECT {WEBHOOK_COPIED}, CASE WHEN state = 'DELIVERING' THEN claimed_by END "
        "FROM webhook_event WHERE state IN ('PENDING', 'DELIVERING')"
    )
    queue = f"SELECT {WEBHOOK_COPIED}, claimed_by FROM webhook_queue"
    with connection.cursor() as cursor:
        cursor.execute(f"({events} EXCEPT ALL {queue}) UNION ALL ({queue} EXCEPT ALL {events})")
        return cursor.fetchall()
