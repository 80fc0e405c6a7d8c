"""The notification table becomes partitioned by week of creation (its UUIDv7 id), so that
keeping N days of history is dropping weeks (delivery/retention.py), never a long DELETE. The
table as it was becomes the default partition, no row moves; this week's partition and the next
two are added. An id's time is always in its creation's week by the database clock. One notification per (client,
idempotency key) is held by each week's unique index and the trigger notification_key_unique
across weeks."""

from django.db import migrations, models

import notifyqueue.history

from notifyqueue.history import history_partitions_add, history_table_partition
from notifyqueue.sqlfile import database_objects_create, database_objects_reload


class Migration(migrations.Migration):

    dependencies = [
        ('notifications', '0012_deferral_by_due_time'),
        ('preferences', '0003_inbox_notification_unchecked'),
        ('delivery', '0013_claim_stops_at_due_end'),
        ('webhooks', '0008_attempts_found_by_event_number'),
        ('receipts', '0001_initial'),
        ('ratelimits', '0002_windows_per_client'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(
                    model_name='notification',
                    name='notification_client_idempotency_key',
                ),
            ],
            database_operations=[
                history_table_partition('notification', key='id', primary_key='id'),
            ],
        ),
        database_objects_create("notifyqueue/sql/functions/history_week.sql"),
        database_objects_reload(
            "notifyqueue/sql/functions/notifyqueue_uuid7.sql",
            "notifications/sql/functions/notification_create_checked.sql",
            "notifications/sql/functions/notifications_create_checked_many.sql",
            "notifications/sql/functions/notification_digest_create.sql",
            "notifications/sql/functions/ratelimit_admit_many.sql",
            "notifications/sql/functions/notification_queue_inserted.sql",
            "notifications/sql/functions/notification_queue_updated.sql",
            "notifications/sql/functions/notification_queue_deleted.sql",
            "notifications/sql/functions/notification_queue_truncated.sql",
            "delivery/sql/functions/notification_wakeup.sql",
            "webhooks/sql/functions/notification_webhook_outbox.sql",
        ),
        database_objects_create(
            "notifyqueue/sql/functions/notifyqueue_uuid7_floor.sql",
            "delivery/sql/functions/history_partition_add.sql",
            "delivery/sql/functions/history_partition_bounds.sql",
            "delivery/sql/functions/notification_week_drop.sql",
            "delivery/sql/functions/notifications_history_delete.sql",
            "notifications/sql/functions/notification_key_unique.sql",
        ),
        history_partitions_add('notification', key='id', unique='client_id, idempotency_key'),
        migrations.AlterField(
            model_name='notification',
            name='id',
            field=models.UUIDField(default=notifyqueue.history.uuid7, editable=False, primary_key=True, serialize=False),
        ),
    ]
