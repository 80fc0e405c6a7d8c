"""Closed digest buckets by close time (notification_digest_closed), so that retention deletes
those closed before its cutoff without reading the others."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("notifications", "0010_digests"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="notificationdigest",
            index=models.Index(
                condition=models.Q(("state", "CLOSED")),
                fields=["closed_at"],
                name="notification_digest_closed",
            ),
        ),
    ]
