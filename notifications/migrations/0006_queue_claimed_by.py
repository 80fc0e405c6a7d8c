"""The queue names each claim's worker: the takeover of a dead worker's claims finds them by
worker (`queue_claimed_by`, an index of the claims in flight only). The triggers copy the
record's claimed_by while it is PROCESSING; the claims already in flight get theirs here. The
index is built CONCURRENTLY, so a live queue keeps taking writes while it is built."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

from notifyqueue.sqlfile import database_objects_reload


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("notifications", "0005_circuit_held_since"),
    ]

    operations = [
        migrations.AddField(
            model_name="notificationqueue",
            name="claimed_by",
            field=models.CharField(max_length=200, null=True),
        ),
        database_objects_reload(
            "notifications/sql/functions/notification_queue_inserted.sql",
            "notifications/sql/functions/notification_queue_updated.sql",
        ),
        migrations.RunSQL(
            "UPDATE notification_queue AS q SET claimed_by = n.claimed_by "
            "FROM notification AS n "
            "WHERE q.status = 'PROCESSING' AND n.id = q.id AND q.claimed_by IS NULL",
            reverse_sql=migrations.RunSQL.noop,
        ),
        AddIndexConcurrently(
            model_name="notificationqueue",
            index=models.Index(
                condition=models.Q(("claimed_by__isnull", False), ("status", "PROCESSING")),
                fields=["claimed_by"],
                name="queue_claimed_by",
            ),
        ),
    ]
