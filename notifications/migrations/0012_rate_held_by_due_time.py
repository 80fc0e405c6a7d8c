"""The rate-limit deferral continues the schedule of a recipient's held rows from the last slot
handed out: notification_rate_held gains (client, channel, due time) after the recipient's
digest, so that slot is one backward probe (delivery's notification_rate_defer_many)."""

import django.db.models.functions.comparison
import django.db.models.functions.text
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('clients', '0001_initial'),
        ('notifications', '0011_digest_buckets_closed'),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name='notification',
            name='notification_rate_held',
        ),
        migrations.AddIndex(
            model_name='notification',
            index=models.Index(django.db.models.functions.comparison.Cast(django.db.models.functions.text.MD5(models.F('recipient')), output_field=models.UUIDField()), models.F('client'), models.F('channel'), models.F('due_at'), condition=models.Q(('rate_deferred_from__isnull', False)), name='notification_rate_held'),
        ),
    ]
