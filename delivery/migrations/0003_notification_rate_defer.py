"""The rate-limit deferral as a function of this app's: it ends a claim and finishes its
attempt, which the rate limiter below this app may reach only so."""

from django.db import migrations

from notifyqueue.sqlfile import database_objects_create


class Migration(migrations.Migration):
    dependencies = [("delivery", "0002_functions")]

    operations = [
        database_objects_create("delivery/sql/functions/notification_rate_defer.sql"),
    ]
