"""A row held by its provider's open circuit: when its hold began, and the index by which the
circuit's closing finds the held rows. The index is built CONCURRENTLY, so a live queue keeps
taking writes while it is built (it has entries only for held rows)."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("clients", "0001_initial"),
        ("notifications", "0004_admission_per_client"),
    ]

    operations = [
        migrations.AddField(
            model_name="notification",
            name="circuit_held_since",
            field=models.DateTimeField(blank=True, null=True),
        ),
        AddIndexConcurrently(
            model_name="notification",
            index=models.Index(
                condition=models.Q(("circuit_held_since__isnull", False)),
                fields=["channel"],
                name="notification_circuit_held",
            ),
        ),
    ]
