"""An inbox message's notification is no longer checked by a foreign key: the notification
table becomes partitioned by week, and a week's partition is dropped whole, its inbox messages
deleted first by retention."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('notifications', '0012_deferral_by_due_time'),
        ('preferences', '0002_quiet_hours'),
    ]

    operations = [
        migrations.AlterField(
            model_name='inboxmessage',
            name='notification',
            field=models.OneToOneField(db_constraint=False, on_delete=django.db.models.deletion.CASCADE, related_name='inbox_message', to='notifications.notification'),
        ),
    ]
