"""The release of held notifications after failed attempts, as a function of this app's: it
reads and moves notifications, which the rate limiter below this app may reach only so."""

from django.db import migrations

from notifyqueue.sqlfile import database_objects_create


class Migration(migrations.Migration):
    dependencies = [("notifications", "0002_functions")]

    operations = [
        database_objects_create("notifications/sql/functions/ratelimit_release_freed.sql"),
    ]
