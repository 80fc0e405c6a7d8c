"""The queue table (notification_queue) against the record it copies, for tests that check the
two agree after writes and faults."""

from __future__ import annotations

from django.db import connection

COPIED = "id, client_id, status, priority, channel, due_at, created_at, claim_expires_at"
QUEUE_COLUMNS = f"{COPIED}, recipient_digest"
# The record's values for the queue's columns.
RECORD_COLUMNS = f"{COPIED}, CASE WHEN status = 'PENDING' THEN md5(recipient)::uuid END"


def queue_differences() -> list[tuple]:
    """Rows the record has and the queue lacks, or the other way round, compared on every
    queue column (the record's SENT rows excluded: they have no queue row). Empty when the
    queue is exactly the record's copy."""
    record = f"SELECT {RECORD_COLUMNS} FROM notification WHERE status <> 'SENT'"
    queue = f"SELECT {QUEUE_COLUMNS} FROM notification_queue"
    with connection.cursor() as cursor:
        cursor.execute(f"({record} EXCEPT ALL {queue}) UNION ALL ({queue} EXCEPT ALL {record})")
        return cursor.fetchall()


def queue_reads() -> dict[str, tuple[int, int]]:
    """What this transaction has read of the queue so far: for the table, (sequential scans,
    rows they returned); for each of its indexes, (scans, entries they returned). Compare two
    readings taken in one transaction (the counters are the transaction's)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT c.relname, pg_stat_get_xact_numscans(c.oid),
                   pg_stat_get_xact_tuples_returned(c.oid)
              FROM pg_class c
             WHERE c.oid = 'notification_queue'::regclass
                OR c.oid IN (SELECT indexrelid FROM pg_index
                              WHERE indrelid = 'notification_queue'::regclass)
            """
        )
        return {name: (scans, returned) for name, scans, returned in cursor.fetchall()}


def queue_reads_since(before: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """The queue's relations read since `before` (a `queue_reads()` of this transaction),
    with their scans and rows or entries returned since."""
    now = queue_reads()
    return {
        name: (scans - before[name][0], returned - before[name][1])
        for name, (scans, returned) in now.items()
        if (scans, returned) != before[name]
    }
