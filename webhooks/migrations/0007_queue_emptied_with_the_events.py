"""TRUNCATE of `webhook_event` empties `webhook_queue` too.

TRUNCATE fires no DELETE trigger, so the queue's delete trigger (migration 0006) did not see
it: the queue kept a row for every truncated event not yet final, and its DELIVERING rows went
on counting against their clients' share of the senders, so those clients' new events were
never claimed. A statement trigger on TRUNCATE empties the queue in the same transaction, by
DELETE: a TRUNCATE of both tables at once (Django's `flush` names every table) may not
truncate the queue again from the trigger.
"""

from django.db import migrations

TRIGGER = """
CREATE FUNCTION webhook_queue_truncated() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM webhook_queue;
    RETURN NULL;
END $$;

CREATE TRIGGER webhook_queue_truncated
AFTER TRUNCATE ON webhook_event
FOR EACH STATEMENT
EXECUTE FUNCTION webhook_queue_truncated();
"""

UNTRIGGER = """
DROP TRIGGER webhook_queue_truncated ON webhook_event;
DROP FUNCTION webhook_queue_truncated();
"""


class Migration(migrations.Migration):
    dependencies = [("webhooks", "0006_queue_table")]

    operations = [migrations.RunSQL(TRIGGER, reverse_sql=UNTRIGGER)]
