"""Clients take turns across claims: each client's last service is kept
(`delivery_client_turn`, numbered by the sequence `delivery_client_turn_claim`), a client's
turns count from the claims the worker already holds for it, and the claim orders each
client's own rows by priority, aged one level per period overdue."""

import django.db.models.deletion
from django.db import migrations, models

from notifyqueue.sqlfile import database_objects_reload


class Migration(migrations.Migration):
    dependencies = [
        ("clients", "0001_initial"),
        ("delivery", "0005_circuit_hold"),
    ]

    operations = [
        migrations.CreateModel(
            name="ClientTurn",
            fields=[
                (
                    "client",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="+",
                        serialize=False,
                        to="clients.client",
                    ),
                ),
                ("served_claim", models.BigIntegerField()),
                ("served_position", models.BigIntegerField()),
            ],
            options={"db_table": "delivery_client_turn"},
        ),
        migrations.RunSQL(
            "CREATE SEQUENCE delivery_client_turn_claim;",
            reverse_sql="DROP SEQUENCE delivery_client_turn_claim;",
        ),
        # New parameters at the end, with defaults: the old signature is dropped, not left
        # beside the new one, and a worker of the previous release calls the new one through
        # the same statement (this migration is one transaction). A database migrated from
        # scratch has only the new one: the earlier migrations load the file as it is now.
        migrations.RunSQL(
            "DROP FUNCTION IF EXISTS notification_claim_due_many(integer, text, double precision);",
            reverse_sql=migrations.RunSQL.noop,
        ),
        database_objects_reload("delivery/sql/functions/notification_claim_due_many.sql"),
    ]
