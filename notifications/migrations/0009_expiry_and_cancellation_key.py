"""Expiry and cancellation by key: a notification's `expires_at` and `cancellation_key`, the
mark a worker sets just before the provider call (`send_started_at`), the EXPIRED status, and
the queue's copies of the expiry and the key's digest with their partial indexes (built
CONCURRENTLY, so a live queue keeps taking writes meanwhile); the queue's triggers and the
checked creates reloaded to carry them."""

import notifications.models
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

from notifyqueue.sqlfile import database_objects_reload


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('notifications', '0008_notification_receipt'),
    ]

    operations = [
        migrations.AddField(
            model_name='notification',
            name='cancellation_key',
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        migrations.AddField(
            model_name='notification',
            name='expires_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='notification',
            name='send_started_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='notificationqueue',
            name='cancellation_digest',
            field=models.UUIDField(null=True),
        ),
        migrations.AddField(
            model_name='notificationqueue',
            name='expires_at',
            field=models.DateTimeField(null=True),
        ),
        migrations.AlterField(
            model_name='notification',
            name='status',
            field=notifications.models.DomainCharField(choices=[('PENDING', 'Pending'), ('PROCESSING', 'Processing'), ('SENT', 'Sent'), ('FAILED', 'Failed'), ('DEAD_LETTERED', 'Dead Lettered'), ('CANCELLED', 'Cancelled'), ('SUPPRESSED', 'Suppressed'), ('EXPIRED', 'Expired')], default='PENDING', domain='notification_status', max_length=16),
        ),
        migrations.AlterField(
            model_name='notificationqueue',
            name='status',
            field=models.CharField(choices=[('PENDING', 'Pending'), ('PROCESSING', 'Processing'), ('SENT', 'Sent'), ('FAILED', 'Failed'), ('DEAD_LETTERED', 'Dead Lettered'), ('CANCELLED', 'Cancelled'), ('SUPPRESSED', 'Suppressed'), ('EXPIRED', 'Expired')], max_length=16),
        ),
        AddIndexConcurrently(
            model_name='notification',
            index=models.Index(condition=models.Q(('cancellation_key__isnull', False)), fields=['cancellation_key'], name='notification_cancellation_key'),
        ),
        # Each row's expiry and cancellation key's digest join the queue (the triggers below
        # copy them; the columns are new, so no row has either yet).
        AddIndexConcurrently(
            model_name='notificationqueue',
            index=models.Index(condition=models.Q(('expires_at__isnull', False), ('status', 'PENDING')), fields=['expires_at'], name='queue_pending_expiry'),
        ),
        AddIndexConcurrently(
            model_name='notificationqueue',
            index=models.Index(condition=models.Q(('cancellation_digest__isnull', False), ('status__in', ['PENDING', 'PROCESSING'])), fields=['client_id', 'cancellation_digest'], name='queue_cancellable'),
        ),
        migrations.RunSQL(
            """
            ALTER DOMAIN notification_status DROP CONSTRAINT notification_status_valid;
            ALTER DOMAIN notification_status ADD CONSTRAINT notification_status_valid
                CHECK (VALUE IN ('PENDING', 'PROCESSING', 'SENT', 'FAILED', 'DEAD_LETTERED',
                                 'CANCELLED', 'SUPPRESSED', 'EXPIRED')) NOT VALID;
            """,
            reverse_sql=migrations.RunSQL.noop,
        ),
        # The queue's triggers copy the new columns. The checked creates take the expiry and
        # the cancellation key and answer the expiry: new arguments and a new result, so the
        # old functions are dropped first, in the same statement as the new ones are made.
        migrations.RunSQL(
            """
            DROP FUNCTION IF EXISTS notification_create_checked(uuid, text, text, text, text,
                text, text, integer, jsonb, text, text, jsonb, jsonb, integer,
                timestamp with time zone, integer, text, text);
            DROP FUNCTION IF EXISTS notifications_create_checked_many(jsonb);
            """
            + database_objects_reload(
                "notifications/sql/functions/notification_queue_inserted.sql",
                "notifications/sql/functions/notification_queue_updated.sql",
                "notifications/sql/functions/notification_create_checked.sql",
                "notifications/sql/functions/notifications_create_checked_many.sql",
            ).sql,
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
