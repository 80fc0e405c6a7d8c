"""The quiet-hours stage: a claim its user's quiet hours hold goes back PENDING without using
an attempt, due at the window's end (`notification_quiet_hold_many`)."""

from django.db import migrations

from notifyqueue.sqlfile import database_objects_create


class Migration(migrations.Migration):
    dependencies = [
        ("delivery", "0007_worker_dead"),
        ("notifications", "0007_quiet_held"),
        ("preferences", "0002_quiet_hours"),
    ]

    operations = [
        database_objects_create("delivery/sql/functions/notification_quiet_hold_many.sql"),
    ]
