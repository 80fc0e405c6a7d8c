"""The deferral schedules a (client, recipient) key's backlog, and with the ceiling on waits
for the address's slot too."""

from django.db import migrations

from notifyqueue.sqlfile import database_objects_reload


class Migration(migrations.Migration):
    dependencies = [
        ("delivery", "0003_notification_rate_defer"),
        ("ratelimits", "0002_windows_per_client"),
    ]

    operations = [
        # Two new parameters at the end, with defaults: the old signature is dropped, not left
        # beside the new one, and a worker of the previous release calls the new one through
        # the same statement (this migration is one transaction). A database migrated from
        # scratch has only the new one: the earlier migrations load the files as they are now.
        migrations.RunSQL(
            "DROP FUNCTION IF EXISTS notification_rate_defer(text, uuid, text, uuid, uuid, integer,"
            " double precision);",
            reverse_sql=migrations.RunSQL.noop,
        ),
        database_objects_reload("delivery/sql/functions/notification_rate_defer.sql"),
    ]
