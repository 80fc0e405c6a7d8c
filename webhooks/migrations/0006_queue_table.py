"""The narrow webhook queue (issue 12): every event not yet final, kept by triggers.

`webhook_event` is both the outbox and the history of every event ever delivered. Its partial
indexes on the state (due events, each client's due and in-flight events, claim expiry) kept
an entry for every delivered event until VACUUM, and the sender's claim stepped over them:
1,362 pages for a one-event claim after 20,000 deliveries, 57 once the table was vacuumed
(docs/performance.md, "Twenty-third round"). On a table that keeps its history, autovacuum
comes by a share of all its rows, so that walk grew with the history; and each VACUUM of it
reads every index of the whole history.

Those indexes move to `webhook_queue`, a few narrow columns of only the PENDING and DELIVERING
events, which the sender's claim, the reaper and the health counts read. Three statement-level
triggers keep it equal to `webhook_event`, whatever statement writes the events (the outbox
trigger, the sender, the reaper, an operator's redelivery, retention): an insert adds the row
while the event is not final, an update copies the queue columns (or removes the row once
DELIVERED or FAILED), a delete removes it. They read the statement's transition tables and
find rows by primary key (`enable_seqscan` off, as notifications 0019), never by a scan.
Like `notification_queue` (notifications 0009, 0018), VACUUM comes by a share of its live rows
and never truncates it, which would lock out every finish's outbox insert.
"""

import django.db.models.deletion
from django.db import migrations, models


QUEUE_COLUMNS = "id, client_id, state, next_attempt_at, created_at, claim_expires_at"
NOT_FINAL = "('PENDING', 'DELIVERING')"

TRIGGERS = f"""
CREATE FUNCTION webhook_queue_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO webhook_queue ({QUEUE_COLUMNS})
    SELECT {QUEUE_COLUMNS} FROM inserted WHERE state IN {NOT_FINAL};
    RETURN NULL;
END $$;

CREATE TRIGGER webhook_queue_inserted
AFTER INSERT ON webhook_event
REFERENCING NEW TABLE AS inserted
FOR EACH STATEMENT
EXECUTE FUNCTION webhook_queue_inserted();

CREATE FUNCTION webhook_queue_updated() RETURNS trigger
LANGUAGE plpgsql SET enable_seqscan = off AS $$
BEGIN
    DELETE FROM webhook_queue
    WHERE id = ANY (ARRAY(SELECT id FROM updated WHERE state NOT IN {NOT_FINAL}));
    INSERT INTO webhook_queue AS q ({QUEUE_COLUMNS})
    SELECT {QUEUE_COLUMNS} FROM updated WHERE state IN {NOT_FINAL}
    ON CONFLICT (id) DO UPDATE
    SET client_id = excluded.client_id, state = excluded.state,
        next_attempt_at = excluded.next_attempt_at, claim_expires_at = excluded.claim_expires_at
    WHERE (q.client_id, q.state, q.next_attempt_at, q.claim_expires_at)
          IS DISTINCT FROM (excluded.client_id, excluded.state, excluded.next_attempt_at,
                            excluded.claim_expires_at);
    RETURN NULL;
END $$;

CREATE TRIGGER webhook_queue_updated
AFTER UPDATE ON webhook_event
REFERENCING NEW TABLE AS updated
FOR EACH STATEMENT
EXECUTE FUNCTION webhook_queue_updated();

CREATE FUNCTION webhook_queue_deleted() RETURNS trigger
LANGUAGE plpgsql SET enable_seqscan = off AS $$
BEGIN
    DELETE FROM webhook_queue WHERE id = ANY (ARRAY(SELECT id FROM deleted));
    RETURN NULL;
END $$;

CREATE TRIGGER webhook_queue_deleted
AFTER DELETE ON webhook_event
REFERENCING OLD TABLE AS deleted
FOR EACH STATEMENT
EXECUTE FUNCTION webhook_queue_deleted();

INSERT INTO webhook_queue ({QUEUE_COLUMNS})
SELECT {QUEUE_COLUMNS} FROM webhook_event WHERE state IN {NOT_FINAL};

ALTER TABLE webhook_queue SET (autovacuum_vacuum_scale_factor = 0.05,
                               autovacuum_vacuum_threshold = 1000,
                               vacuum_truncate = false);
"""

UNTRIGGER = """
DROP TRIGGER webhook_queue_inserted ON webhook_event;
DROP TRIGGER webhook_queue_updated ON webhook_event;
DROP TRIGGER webhook_queue_deleted ON webhook_event;
DROP FUNCTION webhook_queue_inserted();
DROP FUNCTION webhook_queue_updated();
DROP FUNCTION webhook_queue_deleted();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("webhooks", "0005_admin_list_indexes"),
    ]

    operations = [
        migrations.CreateModel(
            name="WebhookQueueEntry",
            fields=[
                (
                    "event",
                    models.OneToOneField(
                        db_column="id",
                        db_constraint=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        primary_key=True,
                        related_name="queue_entry",
                        serialize=False,
                        to="webhooks.webhookevent",
                    ),
                ),
                ("client_id", models.UUIDField()),
                (
                    "state",
                    models.CharField(
                        choices=[("PENDING", "PENDING"), ("DELIVERING", "DELIVERING")],
                        max_length=16,
                    ),
                ),
                ("next_attempt_at", models.DateTimeField()),
                ("created_at", models.DateTimeField()),
                ("claim_expires_at", models.DateTimeField(null=True)),
            ],
            options={
                "db_table": "webhook_queue",
            },
        ),
        migrations.AddIndex(
            model_name="webhookqueueentry",
            index=models.Index(
                condition=models.Q(("state", "PENDING")),
                fields=["next_attempt_at"],
                name="webhook_queue_due",
            ),
        ),
        migrations.AddIndex(
            model_name="webhookqueueentry",
            index=models.Index(
                condition=models.Q(("state", "DELIVERING")),
                fields=["claim_expires_at"],
                name="webhook_queue_claim_expiry",
            ),
        ),
        migrations.AddIndex(
            model_name="webhookqueueentry",
            index=models.Index(
                condition=models.Q(("state", "PENDING")),
                fields=["client_id", "next_attempt_at", "created_at"],
                name="webhook_queue_client_due",
            ),
        ),
        migrations.AddIndex(
            model_name="webhookqueueentry",
            index=models.Index(
                condition=models.Q(("state", "DELIVERING")),
                fields=["client_id"],
                name="webhook_queue_client_busy",
            ),
        ),
        migrations.RunSQL(TRIGGERS, reverse_sql=UNTRIGGER),
        migrations.RemoveIndex(
            model_name="webhookevent",
            name="webhook_event_due",
        ),
        migrations.RemoveIndex(
            model_name="webhookevent",
            name="webhook_event_claim_expiry",
        ),
        migrations.RemoveIndex(
            model_name="webhookevent",
            name="webhook_event_client_due",
        ),
        migrations.RemoveIndex(
            model_name="webhookevent",
            name="webhook_event_client_busy",
        ),
    ]
