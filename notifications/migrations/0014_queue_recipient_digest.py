"""The queue carries a PENDING row's recipient digest, and an index of those rows by it.

A rate-limit deferral schedules the recipient's waiting rows (ratelimits/sql/ratelimits.sql).
It found them through the record's recipient index, which holds every row the recipient ever
had, and read each to check its status: a recipient at its limit with 300,000 delivered rows
made each deferral read all of them (1.6 s, `EXPLAIN ANALYZE`), in the worker's loop, under the
key's lock. The queue holds no SENT row, and `queue_pending_recipient` only the PENDING ones, so
a deferral now reads the recipient's backlog and the claims in flight, whatever its history.

The triggers write `md5(recipient)::uuid` for a PENDING row and NULL for any other, as they copy
the other columns (a fallback to another channel changes the recipient): a claim, which turns
PENDING rows into PROCESSING ones, computes no digest and writes no entry in the new index
(PROCESSING rows are outside it, as they are outside the other PENDING indexes). Computing the
digest for every row a claim updates cost PostgreSQL 1–1.4 µs a drained row.
"""

from importlib import import_module

from django.db import migrations, models
from django.db.models import Q

QUEUE_TABLE = import_module("notifications.migrations.0009_queue_table")

COLUMNS = f"{QUEUE_TABLE.QUEUE_COLUMNS}, recipient_digest"
# What the record gives for those columns.
FROM_RECORD = (
    f"{QUEUE_TABLE.QUEUE_COLUMNS}, "
    "CASE WHEN status = 'PENDING' THEN md5(recipient)::uuid END"
)

TRIGGERS = f"""
CREATE OR REPLACE FUNCTION notification_queue_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO notification_queue ({COLUMNS})
    SELECT {FROM_RECORD} FROM inserted WHERE status <> 'SENT';
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION notification_queue_updated() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM notification_queue
    WHERE id = ANY (ARRAY(SELECT id FROM updated WHERE status = 'SENT'));
    INSERT INTO notification_queue AS q ({COLUMNS})
    SELECT {FROM_RECORD} FROM updated WHERE status <> 'SENT'
    ON CONFLICT (id) DO UPDATE
    SET status = excluded.status, priority = excluded.priority, channel = excluded.channel,
        due_at = excluded.due_at, claim_expires_at = excluded.claim_expires_at,
        recipient_digest = excluded.recipient_digest
    WHERE (q.status, q.priority, q.channel, q.due_at, q.claim_expires_at, q.recipient_digest)
          IS DISTINCT FROM (excluded.status, excluded.priority, excluded.channel,
                            excluded.due_at, excluded.claim_expires_at,
                            excluded.recipient_digest);
    RETURN NULL;
END $$;
"""

# 0009's functions, as they were (CREATE FUNCTION becomes CREATE OR REPLACE).
UNTRIGGERS = "\n\n".join(
    part.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")
    for part in QUEUE_TABLE.TRIGGERS.strip().split("\n\n")
    if part.startswith(
        ("CREATE FUNCTION notification_queue_inserted", "CREATE FUNCTION notification_queue_updated")
    )
)

BACKFILL = """
UPDATE notification_queue AS q SET recipient_digest = md5(n.recipient)::uuid
FROM notification AS n WHERE n.id = q.id AND q.status = 'PENDING';
"""


class Migration(migrations.Migration):
    dependencies = [("notifications", "0013_recipient_digest_btree")]

    operations = [
        migrations.AddField(
            model_name="notificationqueue",
            name="recipient_digest",
            field=models.UUIDField(null=True),
        ),
        migrations.RunSQL(TRIGGERS + BACKFILL, reverse_sql=UNTRIGGERS),
        migrations.AddIndex(
            model_name="notificationqueue",
            index=models.Index(
                condition=Q(status="PENDING"),
                fields=["recipient_digest"],
                name="queue_pending_recipient",
            ),
        ),
    ]
