"""The admin's event list, newest first, a page at a time however many events there are: an
index for all events, one per client (it replaces the plain client index Django made for the
foreign key, so an event still writes one client entry), one for the given-up events. Built
CONCURRENTLY: the outbox writes an event in every finish, which a plain CREATE INDEX would
block while it reads the table. The status filter's choices are the statuses an event reports.
"""

import django.db.models.deletion
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("clients", "0005_request_window_unlogged"),
        ("notifications", "0015_cancelled_rows_not_held"),
        ("webhooks", "0004_event_notification_unchecked"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="webhookevent",
            index=models.Index(fields=["-created_at", "-id"], name="webhook_event_recent"),
        ),
        AddIndexConcurrently(
            model_name="webhookevent",
            index=models.Index(
                fields=["client", "-created_at", "-id"], name="webhook_event_client_recent"
            ),
        ),
        AddIndexConcurrently(
            model_name="webhookevent",
            index=models.Index(
                condition=models.Q(("state", "FAILED")),
                fields=["-created_at", "-id"],
                name="webhook_event_failed",
            ),
        ),
        migrations.AlterField(
            model_name="webhookevent",
            name="client",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to="clients.client",
            ),
        ),
        migrations.AlterField(
            model_name="webhookevent",
            name="status",
            field=models.CharField(
                choices=[
                    ("SENT", "SENT"),
                    ("FAILED", "FAILED"),
                    ("DEAD_LETTERED", "DEAD_LETTERED"),
                    ("SUPPRESSED", "SUPPRESSED"),
                ],
                max_length=16,
            ),
        ),
    ]
