"""The notifications app's functions and triggers, from `notifications/sql/functions/`: the
queue table's triggers, the checked creates, the pending count, and the rate-limit admission
(it moves the notifications a deferral holds, so it is this app's)."""

from django.db import migrations

from notifyqueue.sqlfile import database_objects_create


class Migration(migrations.Migration):
    # What this migration stands for in a database migrated before the migrations were
    # squashed: Django then counts it as applied.
    replaces = [("notifications", "0023_queue_emptied_with_the_record")]

    dependencies = [
        ("notifications", "0001_initial"),
        ("ratelimits", "0001_initial"),
    ]

    operations = [
        database_objects_create(
            "notifications/sql/functions/notification_queue_inserted.sql",
            "notifications/sql/functions/notification_queue_updated.sql",
            "notifications/sql/functions/notification_queue_deleted.sql",
            "notifications/sql/functions/notification_queue_truncated.sql",
            "notifications/sql/functions/notification_create_checked.sql",
            "notifications/sql/functions/notifications_create_checked_many.sql",
            "notifications/sql/functions/notification_client_pending_count.sql",
            "notifications/sql/functions/ratelimit_release_next.sql",
            "notifications/sql/functions/ratelimit_admit_many.sql",
            "notifications/sql/functions/ratelimit_admit.sql",
        ),
    ]
