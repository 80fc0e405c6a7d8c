"""DIGESTED is a final status with its webhook event, as SENT, FAILED, DEAD_LETTERED,
SUPPRESSED and EXPIRED are."""

from django.db import migrations, models

from notifyqueue.sqlfile import database_objects_reload


class Migration(migrations.Migration):

    dependencies = [
        ('webhooks', '0005_expired_events'),
        ('notifications', '0010_digests'),
    ]

    operations = [
        migrations.AlterField(
            model_name='webhookevent',
            name='status',
            field=models.CharField(choices=[('SENT', 'SENT'), ('FAILED', 'FAILED'), ('DEAD_LETTERED', 'DEAD_LETTERED'), ('SUPPRESSED', 'SUPPRESSED'), ('EXPIRED', 'EXPIRED'), ('DIGESTED', 'DIGESTED')], max_length=16),
        ),
        database_objects_reload("webhooks/sql/functions/notification_webhook_outbox.sql"),
    ]
