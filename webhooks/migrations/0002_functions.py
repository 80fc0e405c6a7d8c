"""The webhooks app's triggers, from `webhooks/sql/functions/`: the queue table's, and the
outbox on `notification` that writes a webhook event for each final status."""

from django.db import migrations

from notifyqueue.sqlfile import database_objects_create


class Migration(migrations.Migration):
    # What this migration stands for in a database migrated before the migrations were
    # squashed: Django then counts it as applied.
    replaces = [("webhooks", "0007_queue_emptied_with_the_events")]

    dependencies = [("webhooks", "0001_initial")]

    operations = [
        database_objects_create(
            "webhooks/sql/functions/webhook_queue_inserted.sql",
            "webhooks/sql/functions/webhook_queue_updated.sql",
            "webhooks/sql/functions/webhook_queue_deleted.sql",
            "webhooks/sql/functions/webhook_queue_truncated.sql",
            "webhooks/sql/functions/notification_webhook_outbox.sql",
        ),
    ]
