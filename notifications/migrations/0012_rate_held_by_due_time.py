"""The rate-limit deferral continues the schedule of a recipient's held rows from the last slot
handed out: notification_rate_held gains (client, channel, due time) after the recipient's
digest, so that slot is one backward probe (delivery's notification_rate_defer_many). The
admission and the release after failed attempts probe a key's held rows one row per key,
never by a join that reads every held row, and a freed slot lets the key's earliest held row
go, the first entry of its range. The queue's index of a recipient's waiting rows, which the
deferral read its whole backlog through, goes."""

import django.db.models.functions.comparison
import django.db.models.functions.text
from django.db import migrations, models

from notifyqueue.sqlfile import database_objects_reload


class Migration(migrations.Migration):

    dependencies = [
        ('clients', '0001_initial'),
        ('notifications', '0011_digest_buckets_closed'),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name='notificationqueue',
            name='queue_pending_recipient',
        ),
        migrations.RemoveIndex(
            model_name='notification',
            name='notification_rate_held',
        ),
        migrations.AddIndex(
            model_name='notification',
            index=models.Index(django.db.models.functions.comparison.Cast(django.db.models.functions.text.MD5(models.F('recipient')), output_field=models.UUIDField()), models.F('client'), models.F('channel'), models.F('due_at'), condition=models.Q(('rate_deferred_from__isnull', False)), name='notification_rate_held'),
        ),
        database_objects_reload(
            "notifications/sql/functions/ratelimit_admit_many.sql",
            "notifications/sql/functions/ratelimit_release_freed.sql",
            "notifications/sql/functions/ratelimit_release_next.sql",
        ),
    ]
