"""Digests: a rate-limit deferral leaves the rows a digest bucket collected where they are
(they wait for the bucket's close, never for a slot)."""

from django.db import migrations

from notifyqueue.sqlfile import database_objects_reload


class Migration(migrations.Migration):

    dependencies = [
        ('delivery', '0010_expiry_and_cancellation'),
        ('notifications', '0010_digests'),
    ]

    operations = [
        database_objects_reload("delivery/sql/functions/notification_rate_defer.sql"),
    ]
