"""A sender's step, its finish and its claim, in one function (webhook_events_step): one round
trip a step, plans kept per connection, a commit that does not wait for the disk."""

from django.db import migrations

from notifyqueue.sqlfile import database_objects_create


class Migration(migrations.Migration):

    dependencies = [("webhooks", "0006_digested_events")]

    operations = [
        database_objects_create("webhooks/sql/functions/webhook_events_step.sql"),
    ]
