"""A webhook claim names its worker, whose death hands it over at once (not only its claim
timeout): `claimed_by` on the event, copied to the queue while DELIVERING by the triggers, and
the queue's index of the events in flight by worker (`webhook_queue_claimed_by`), built
CONCURRENTLY. Claims made before this name no worker and wait for their claim timeout."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

from notifyqueue.sqlfile import database_objects_reload


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("webhooks", "0002_functions"),
    ]

    operations = [
        migrations.AddField(
            model_name="webhookevent",
            name="claimed_by",
            field=models.CharField(blank=True, max_length=200, null=True),
        ),
        migrations.AddField(
            model_name="webhookqueueentry",
            name="claimed_by",
            field=models.CharField(max_length=200, null=True),
        ),
        database_objects_reload(
            "webhooks/sql/functions/webhook_queue_inserted.sql",
            "webhooks/sql/functions/webhook_queue_updated.sql",
        ),
        AddIndexConcurrently(
            model_name="webhookqueueentry",
            index=models.Index(
                condition=models.Q(("claimed_by__isnull", False), ("state", "DELIVERING")),
                fields=["claimed_by"],
                name="webhook_queue_claimed_by",
            ),
        ),
    ]
