"""The webhook outbox trigger runs once per statement instead of once per row.

Its rule does not change (migration 0002): a row whose status an UPDATE changes to a reported
final status (SENT, FAILED, DEAD_LETTERED, SUPPRESSED) gets its webhook event in the same
transaction, if its client has a webhook URL, whichever statement changed it. Run per row it
cost a PL/pgSQL call and a look-up of the client for every delivered row (about 6 µs of
PostgreSQL's CPU each); per statement, one insert reads the statement's old and new rows
(transition tables, as the queue table's triggers do, migration notifications 0009) and joins
the clients once. A trigger with transition tables cannot name columns (`UPDATE OF status`),
so it runs after every UPDATE of the table and picks the rows whose status changed itself.
"""

from importlib import import_module

from django.db import migrations

PER_STATEMENT = """
DROP TRIGGER notification_webhook_outbox ON notification;

CREATE OR REPLACE FUNCTION notification_webhook_outbox() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO webhook_event (id, client_id, notification_id, status, attempt_count,
                               occurred_at, state, delivery_attempts, next_attempt_at, created_at)
    SELECT gen_random_uuid(), after.client_id, after.id, after.status, after.attempt_count,
           after.updated_at, 'PENDING', 0, after.updated_at, after.updated_at
    FROM outbox_new AS after
    JOIN clients_client AS c ON c.id = after.client_id
    WHERE after.status IN ('SENT', 'FAILED', 'DEAD_LETTERED', 'SUPPRESSED')
      -- Its status changed. A hashed subplan: the planner takes a transition table for one
      -- row, so a join of the two would be a nested loop, one row times the other.
      AND (after.id, after.status) NOT IN (SELECT id, status FROM outbox_old)
      AND c.webhook_url <> '';
    RETURN NULL;
END $$;

CREATE TRIGGER notification_webhook_outbox
AFTER UPDATE ON notification
REFERENCING OLD TABLE AS outbox_old NEW TABLE AS outbox_new
FOR EACH STATEMENT
EXECUTE FUNCTION notification_webhook_outbox();
"""

# Migration 0002's row trigger, put back when this migration is reversed.
PER_ROW = "DROP TRIGGER notification_webhook_outbox ON notification;\n" + import_module(
    "delivery.migrations.0002_notification_triggers"
).OUTBOX.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")


class Migration(migrations.Migration):
    dependencies = [("delivery", "0006_attempt_fillfactor")]

    operations = [migrations.RunSQL(PER_STATEMENT, reverse_sql=PER_ROW)]
