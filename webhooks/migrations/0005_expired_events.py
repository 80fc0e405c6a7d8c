"""EXPIRED is a final status with its webhook event, as SENT, FAILED, DEAD_LETTERED and
SUPPRESSED are."""

from django.db import migrations, models

from notifyqueue.sqlfile import database_objects_reload


class Migration(migrations.Migration):

    dependencies = [
        ('webhooks', '0004_receipt_events'),
        ('notifications', '0009_expiry_and_cancellation_key'),
    ]

    operations = [
        migrations.AlterField(
            model_name='webhookevent',
            name='status',
            field=models.CharField(choices=[('SENT', 'SENT'), ('FAILED', 'FAILED'), ('DEAD_LETTERED', 'DEAD_LETTERED'), ('SUPPRESSED', 'SUPPRESSED'), ('EXPIRED', 'EXPIRED')], max_length=16),
        ),
        database_objects_reload("webhooks/sql/functions/notification_webhook_outbox.sql"),
    ]
