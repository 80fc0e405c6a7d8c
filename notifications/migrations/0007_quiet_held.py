"""A row held by its user's quiet hours: when its hold began, the index by which a change of
the user's time zone or windows finds the held rows (built CONCURRENTLY, so a live queue keeps
taking writes; it has entries only for held rows), and the trigger that re-times them."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

from notifyqueue.sqlfile import database_objects_create


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("notifications", "0006_queue_claimed_by"),
        ("preferences", "0002_quiet_hours"),
    ]

    operations = [
        migrations.AddField(
            model_name="notification",
            name="quiet_held_since",
            field=models.DateTimeField(blank=True, null=True),
        ),
        AddIndexConcurrently(
            model_name="notification",
            index=models.Index(
                condition=models.Q(("quiet_held_since__isnull", False)),
                fields=["client", "user_id"],
                name="notification_quiet_held",
            ),
        ),
        database_objects_create(
            "notifications/sql/functions/user_preferences_quiet_hours_changed.sql"
        ),
    ]
