"""The one definition of a dead worker (`worker_dead`): stopped, or no heartbeat for
NOTIFYQUEUE_WORKER_DEAD_AFTER_SECONDS by the database's clock. The takeover of claims
(notifications and webhook events) and /status read it."""

from django.db import migrations

from notifyqueue.sqlfile import database_objects_create


class Migration(migrations.Migration):
    dependencies = [
        ("delivery", "0006_client_turns"),
    ]

    operations = [
        database_objects_create("delivery/sql/functions/worker_dead.sql"),
    ]
