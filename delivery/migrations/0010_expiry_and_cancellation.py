"""Expiry and cancellation by key in the worker: the claim answers each row's expiry and
whether it may be cancelled, the finish clears the send's start mark, and the cancel by key
(`notifications_cancel_by_key`) ends claims as well as waiting rows."""

from django.db import migrations, models

from notifyqueue.sqlfile import database_objects_create, database_objects_reload


class Migration(migrations.Migration):

    dependencies = [
        ('delivery', '0009_attempt_by_message_id'),
        ('notifications', '0009_expiry_and_cancellation_key'),
    ]

    operations = [
        migrations.AlterField(
            model_name='deliveryattempt',
            name='outcome',
            field=models.CharField(blank=True, choices=[('SENT', 'Sent'), ('TEMPORARY_FAILURE', 'Temporary Failure'), ('PERMANENT_FAILURE', 'Permanent Failure'), ('ABANDONED', 'Abandoned'), ('RELEASED', 'Released'), ('RATE_LIMITED', 'Rate Limited'), ('REROUTED', 'Rerouted'), ('SUPPRESSED', 'Suppressed'), ('EXPIRED', 'Expired'), ('CANCELLED', 'Cancelled')], max_length=24, null=True),
        ),
        # The claim answers each row's expiry and whether it may be cancelled: a new result,
        # so the old function is dropped first, in the same statement as the new one is made.
        migrations.RunSQL(
            "DROP FUNCTION IF EXISTS notification_claim_due_many(integer, text, double precision, "
            "double precision, uuid[], integer[]);"
            + database_objects_reload(
                "delivery/sql/functions/notification_claim_due_many.sql",
                "delivery/sql/functions/notification_finish_many.sql",
            ).sql,
            reverse_sql=migrations.RunSQL.noop,
        ),
        database_objects_create("delivery/sql/functions/notifications_cancel_by_key.sql"),
    ]
