"""The rate-limit deferral is bounded whatever the recipient's backlog: one statement for a
step's over-limit claims (notification_rate_defer_many), which moves each key's claimed rows
and its rows at the head of the client's due range into the next free slots after the last
one handed out; the deferral of one claim calls it."""

from django.db import migrations

from notifyqueue.sqlfile import database_objects_create, database_objects_reload


class Migration(migrations.Migration):
    dependencies = [
        ("delivery", "0011_digests"),
        ("notifications", "0012_deferral_by_due_time"),
    ]

    operations = [
        database_objects_create("delivery/sql/functions/notification_rate_defer_many.sql"),
        database_objects_reload("delivery/sql/functions/notification_rate_defer.sql"),
    ]
