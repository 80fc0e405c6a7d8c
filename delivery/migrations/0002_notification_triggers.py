"""Two triggers on the notification table.

- The webhook outbox: a row that reaches a reported final status gets its webhook event in the
  same transaction, whichever statement changed it (worker finish, reaper, operator action).
- The wake-up: inserting a notification, or putting one back to PENDING, sends
  NOTIFY notifyqueue_due so idle workers claim it at once instead of at their next poll.
"""

from django.db import migrations

OUTBOX = """
CREATE FUNCTION notification_webhook_outbox() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO webhook_event (id, client_id, notification_id, status, attempt_count,
                               occurred_at, state, delivery_attempts, next_attempt_at, created_at)
    SELECT gen_random_uuid(), NEW.client_id, NEW.id, NEW.status, NEW.attempt_count,
           NEW.updated_at, 'PENDING', 0, NEW.updated_at, NEW.updated_at
    FROM clients_client AS c
    WHERE c.id = NEW.client_id AND c.webhook_url <> '';
    RETURN NULL;
END $$;

CREATE TRIGGER notification_webhook_outbox
AFTER UPDATE OF status ON notification
FOR EACH ROW
WHEN (NEW.status IN ('SENT', 'FAILED', 'DEAD_LETTERED', 'SUPPRESSED')
      AND OLD.status IS DISTINCT FROM NEW.status)
EXECUTE FUNCTION notification_webhook_outbox();
"""

WAKEUP = """
CREATE FUNCTION notification_wakeup() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('notifyqueue_due', '');
    RETURN NULL;
END $$;

CREATE TRIGGER notification_wakeup_insert
AFTER INSERT ON notification
FOR EACH STATEMENT
EXECUTE FUNCTION notification_wakeup();

CREATE TRIGGER notification_wakeup_pending
AFTER UPDATE OF status ON notification
FOR EACH ROW
WHEN (NEW.status = 'PENDING' AND OLD.status <> 'PENDING')
EXECUTE FUNCTION notification_wakeup();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("delivery", "0001_initial"),
        ("notifications", "0001_initial"),
        ("webhooks", "0001_initial"),
        ("clients", "0001_initial"),
    ]

    operations = [
        migrations.RunSQL(
            OUTBOX,
            reverse_sql="DROP TRIGGER notification_webhook_outbox ON notification;"
            "DROP FUNCTION notification_webhook_outbox();",
        ),
        migrations.RunSQL(
            WAKEUP,
            reverse_sql="DROP TRIGGER notification_wakeup_insert ON notification;"
            "DROP TRIGGER notification_wakeup_pending ON notification;"
            "DROP FUNCTION notification_wakeup();",
        ),
    ]
