"""A rate-limit deferral continues a key's schedule from the last slot it handed out:
queue_pending_recipient gains (client, channel, due time) after the recipient's digest, so that
slot is one backward probe of the key's waiting rows, and a freed slot lets the key's earliest
held row go, the first of its range. The admission and the release after failed attempts probe
a key's held rows one row per key, never by a join that reads every held row."""

from django.db import migrations, models

from notifyqueue.sqlfile import database_objects_reload


class Migration(migrations.Migration):

    dependencies = [
        ('notifications', '0011_digest_buckets_closed'),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name='notificationqueue',
            name='queue_pending_recipient',
        ),
        migrations.AddIndex(
            model_name='notificationqueue',
            index=models.Index(condition=models.Q(('status', 'PENDING')), fields=['recipient_digest', 'client_id', 'channel', 'due_at'], name='queue_pending_recipient'),
        ),
        database_objects_reload(
            "notifications/sql/functions/ratelimit_admit_many.sql",
            "notifications/sql/functions/ratelimit_release_freed.sql",
            "notifications/sql/functions/ratelimit_release_next.sql",
        ),
    ]
