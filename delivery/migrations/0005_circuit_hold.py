"""The circuit hold: a claim refused by its provider's open circuit goes back PENDING without
using an attempt (`notification_circuit_hold_many`), the circuit's closing lets the held rows go
(`notification_circuit_release`), and the finish ends a hold (`notification_finish_many`)."""

from django.db import migrations

from notifyqueue.sqlfile import database_objects_create, database_objects_reload


class Migration(migrations.Migration):
    dependencies = [
        ("delivery", "0004_rate_defer_per_client"),
        ("circuits", "0001_initial"),
        ("notifications", "0005_circuit_held_since"),
    ]

    operations = [
        database_objects_create(
            "delivery/sql/functions/notification_circuit_hold_many.sql",
            "delivery/sql/functions/notification_circuit_release.sql",
        ),
        database_objects_reload("delivery/sql/functions/notification_finish_many.sql"),
    ]
