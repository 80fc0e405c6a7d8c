"""TRUNCATE of `notification` empties `notification_queue` too.

TRUNCATE fires no DELETE trigger, so the queue's delete trigger (migration 0009) did not see
it: the queue kept a row for every truncated notification not SENT, which the backlog check
counted against its client's cap and each claim found and could not join to a record. A
statement trigger on TRUNCATE empties the queue in the same transaction, by DELETE: a
TRUNCATE of both tables at once (Django's `flush` names every table) may not truncate the
queue again from the trigger.
"""

from django.db import migrations

TRIGGER = """
CREATE FUNCTION notification_queue_truncated() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM notification_queue;
    RETURN NULL;
END $$;

CREATE TRIGGER notification_queue_truncated
AFTER TRUNCATE ON notification
FOR EACH STATEMENT
EXECUTE FUNCTION notification_queue_truncated();
"""

UNTRIGGER = """
DROP TRIGGER notification_queue_truncated ON notification;
DROP FUNCTION notification_queue_truncated();
"""


class Migration(migrations.Migration):
    dependencies = [("notifications", "0022_create_checked_answers_chosen_columns")]

    operations = [migrations.RunSQL(TRIGGER, reverse_sql=UNTRIGGER)]
