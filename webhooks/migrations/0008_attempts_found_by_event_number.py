"""An attempt is found by its event through the unique (event, number) index, so the foreign
key's own index of the event alone (one more entry written per POST) is dropped, CONCURRENTLY:
the attempts table takes writes meanwhile."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("webhooks", "0007_events_step"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="webhookdeliveryattempt",
                    name="event",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="attempts",
                        to="webhooks.webhookevent",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    "DROP INDEX CONCURRENTLY IF EXISTS webhook_delivery_attempt_event_id_de31e018",
                    reverse_sql="CREATE INDEX CONCURRENTLY IF NOT EXISTS "
                    "webhook_delivery_attempt_event_id_de31e018 "
                    "ON webhook_delivery_attempt (event_id)",
                ),
            ],
        ),
    ]
