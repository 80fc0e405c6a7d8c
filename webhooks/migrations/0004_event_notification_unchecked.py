"""webhook_event.notification_id without a foreign-key constraint (issue 12).

The event is written by the trigger on the notification's own update (the finish of a final
status), so the row exists; the check at commit locked it FOR KEY SHARE after that update, a
MultiXact per finished message of a client with a webhook. See delivery 0009.
"""
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('notifications', '0012_create_checked_function'),
        ('webhooks', '0003_fair_claim_indexes'),
    ]

    operations = [
        migrations.AlterField(
            model_name='webhookevent',
            name='notification',
            field=models.ForeignKey(db_constraint=False, on_delete=django.db.models.deletion.CASCADE, related_name='webhook_events', to='notifications.notification'),
        ),
    ]
