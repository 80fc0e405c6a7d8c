"""The admin's search by user id, whatever the client: an index on user_id, built CONCURRENTLY
(preferences are read by every delivery in preference mode and written by the API), then
Django's plain index on the client dropped (the unique (client, user_id) index serves every
lookup by client)."""

import django.db.models.deletion
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("clients", "0005_request_window_unlogged"),
        ("preferences", "0001_initial"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="userpreferences",
            index=models.Index(fields=["user_id"], name="user_preferences_user"),
        ),
        migrations.AlterField(
            model_name="userpreferences",
            name="client",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to="clients.client",
            ),
        ),
    ]
