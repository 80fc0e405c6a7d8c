"""The narrow queue table (issue 12): every notification not SENT, kept by triggers.

The wide `notification` table loses every index that names status, due time or claim, so a
claim and a finish update its row in place (HOT: no index entry written) once the page has room
(fillfactor 70); the by-status and by-due-time indexes live on `notification_queue`, a few
narrow columns of only the rows not yet delivered.

Three statement-level triggers keep the queue table equal to the record, whatever statement
changes the record (worker, reaper, API, admin, retention): an insert adds the row unless it
is already SENT, an update copies the queue columns (or removes the row once SENT), a delete
removes it. They read the statement's transition tables, so a claim of 100 rows costs one
trigger call, not 100; each look-up goes through the queue's primary key (`= ANY (ARRAY(...))`
and ON CONFLICT), never a scan of the queue.
"""

import django.db.models.deletion
from django.db import migrations, models


QUEUE_COLUMNS = "id, client_id, status, priority, channel, due_at, created_at, claim_expires_at"

TRIGGERS = f"""
CREATE FUNCTION notification_queue_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO notification_queue ({QUEUE_COLUMNS})
    SELECT {QUEUE_COLUMNS} FROM inserted WHERE status <> 'SENT';
    RETURN NULL;
END $$;

CREATE TRIGGER notification_queue_inserted
AFTER INSERT ON notification
REFERENCING NEW TABLE AS inserted
FOR EACH STATEMENT
EXECUTE FUNCTION notification_queue_inserted();

CREATE FUNCTION notification_queue_updated() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM notification_queue
    WHERE id = ANY (ARRAY(SELECT id FROM updated WHERE status = 'SENT'));
    INSERT INTO notification_queue AS q ({QUEUE_COLUMNS})
    SELECT {QUEUE_COLUMNS} FROM updated WHERE status <> 'SENT'
    ON CONFLICT (id) DO UPDATE
    SET status = excluded.status, priority = excluded.priority, channel = excluded.channel,
        due_at = excluded.due_at, claim_expires_at = excluded.claim_expires_at
    WHERE (q.status, q.priority, q.channel, q.due_at, q.claim_expires_at)
          IS DISTINCT FROM (excluded.status, excluded.priority, excluded.channel,
                            excluded.due_at, excluded.claim_expires_at);
    RETURN NULL;
END $$;

CREATE TRIGGER notification_queue_updated
AFTER UPDATE ON notification
REFERENCING NEW TABLE AS updated
FOR EACH STATEMENT
EXECUTE FUNCTION notification_queue_updated();

CREATE FUNCTION notification_queue_deleted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM notification_queue WHERE id = ANY (ARRAY(SELECT id FROM deleted));
    RETURN NULL;
END $$;

CREATE TRIGGER notification_queue_deleted
AFTER DELETE ON notification
REFERENCING OLD TABLE AS deleted
FOR EACH STATEMENT
EXECUTE FUNCTION notification_queue_deleted();
"""

UNTRIGGER = """
DROP TRIGGER notification_queue_inserted ON notification;
DROP TRIGGER notification_queue_updated ON notification;
DROP TRIGGER notification_queue_deleted ON notification;
DROP FUNCTION notification_queue_inserted();
DROP FUNCTION notification_queue_updated();
DROP FUNCTION notification_queue_deleted();
"""

BACKFILL = f"""
INSERT INTO notification_queue ({QUEUE_COLUMNS})
SELECT {QUEUE_COLUMNS} FROM notification WHERE status <> 'SENT';
"""

# Room on each page of the record for the new version a claim or a finish writes, so the
# update stays on the page (HOT). Only pages written from now on get it.
STORAGE = """
ALTER TABLE notification SET (fillfactor = 70);
ALTER TABLE notification_queue SET (autovacuum_vacuum_scale_factor = 0.05,
                                    autovacuum_vacuum_threshold = 1000);
"""

UNSTORAGE = """
ALTER TABLE notification RESET (fillfactor);
"""


class Migration(migrations.Migration):
    dependencies = [
        ("notifications", "0008_rate_held_index"),
    ]

    operations = [
        migrations.CreateModel(
            name="NotificationQueue",
            fields=[
                (
                    "notification",
                    models.OneToOneField(
                        db_column="id",
                        db_constraint=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        primary_key=True,
                        related_name="queue_entry",
                        serialize=False,
                        to="notifications.notification",
                    ),
                ),
                ("client_id", models.UUIDField()),
                (
                    "status",
                    models.CharField(
                        choices=[
                            ("PENDING", "Pending"),
                            ("PROCESSING", "Processing"),
                            ("SENT", "Sent"),
                            ("FAILED", "Failed"),
                            ("DEAD_LETTERED", "Dead Lettered"),
                            ("CANCELLED", "Cancelled"),
                            ("SUPPRESSED", "Suppressed"),
                        ],
                        max_length=16,
                    ),
                ),
                (
                    "priority",
                    models.SmallIntegerField(
                        choices=[(0, "Critical"), (1, "High"), (2, "Normal"), (3, "Low")]
                    ),
                ),
                (
                    "channel",
                    models.CharField(
                        choices=[
                            ("email", "Email"),
                            ("sms", "Sms"),
                            ("push", "Push"),
                            ("in_app", "In App"),
                        ],
                        max_length=16,
                    ),
                ),
                ("due_at", models.DateTimeField()),
                ("created_at", models.DateTimeField()),
                ("claim_expires_at", models.DateTimeField(null=True)),
            ],
            options={
                "db_table": "notification_queue",
            },
        ),
        migrations.RunSQL(BACKFILL, reverse_sql=migrations.RunSQL.noop),
        migrations.RunSQL(TRIGGERS, reverse_sql=UNTRIGGER),
        migrations.RunSQL(STORAGE, reverse_sql=UNSTORAGE),
        migrations.RemoveIndex(
            model_name="notification",
            name="notification_pending_claim",
        ),
        migrations.RemoveIndex(
            model_name="notification",
            name="notification_claim_expiry",
        ),
        migrations.RemoveIndex(
            model_name="notification",
            name="notification_client_status",
        ),
        migrations.RemoveIndex(
            model_name="notification",
            name="notification_client_pending",
        ),
        migrations.RemoveIndex(
            model_name="notification",
            name="notification_operator_queue",
        ),
        migrations.RemoveIndex(
            model_name="notification",
            name="notification_pending_client",
        ),
        migrations.AddIndex(
            model_name="notificationqueue",
            index=models.Index(
                condition=models.Q(("status", "PENDING")),
                fields=["priority", "client_id", "due_at", "created_at"],
                name="queue_pending_client",
            ),
        ),
        migrations.AddIndex(
            model_name="notificationqueue",
            index=models.Index(
                condition=models.Q(("status", "PENDING")),
                fields=["priority", "due_at"],
                name="queue_pending_due",
            ),
        ),
        migrations.AddIndex(
            model_name="notificationqueue",
            index=models.Index(
                condition=models.Q(("status", "PROCESSING")),
                fields=["claim_expires_at"],
                name="queue_claim_expiry",
            ),
        ),
        migrations.AddIndex(
            model_name="notificationqueue",
            index=models.Index(
                condition=models.Q(("status", "PROCESSING"), _negated=True),
                fields=["client_id", "status", "-created_at", "-notification"],
                name="queue_client_status",
            ),
        ),
        migrations.AddIndex(
            model_name="notificationqueue",
            index=models.Index(
                fields=["status", "created_at", "notification"],
                include=("channel", "priority"),
                name="queue_status",
                condition=models.Q(("status", "PROCESSING"), _negated=True),
            ),
        ),
    ]
