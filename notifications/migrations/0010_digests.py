"""Digests: the buckets (notification_digest), a notification's bucket, close time and digest,
the DIGESTED status, the index of a bucket's rows (built CONCURRENTLY, so a live queue keeps
taking writes meanwhile), and the functions of the create with a digest key and of the close."""

import django.db.models.deletion
from django.contrib.postgres.operations import AddIndexConcurrently
import notifications.models
import uuid
from django.db import migrations, models

from notifyqueue.sqlfile import database_objects_create


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('clients', '0001_initial'),
        ('notifications', '0009_expiry_and_cancellation_key'),
        # notification_digests_claim judges a closing worker by worker_dead.
        ('delivery', '0007_worker_dead'),
    ]

    operations = [
        migrations.CreateModel(
            name='NotificationDigest',
            fields=[
                ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('identity', models.UUIDField()),
                ('digest_key', models.CharField(max_length=255)),
                ('channel', models.CharField(choices=[('email', 'Email'), ('sms', 'Sms'), ('push', 'Push'), ('in_app', 'In App')], max_length=16)),
                ('recipient', models.CharField(max_length=4096)),
                ('user_id', models.CharField(blank=True, max_length=255, null=True)),
                ('template', models.CharField(max_length=255)),
                ('opened_by', models.UUIDField()),
                ('opened_at', models.DateTimeField()),
                ('closes_at', models.DateTimeField()),
                ('collected', models.PositiveIntegerField(default=0)),
                ('state', models.CharField(choices=[('OPEN', 'Open'), ('CLOSING', 'Closing'), ('CLOSED', 'Closed')], default='OPEN', max_length=16)),
                ('digest_id', models.UUIDField(blank=True, null=True)),
                ('digested', models.PositiveIntegerField(blank=True, null=True)),
                ('claim_token', models.UUIDField(blank=True, null=True)),
                ('claimed_by', models.CharField(blank=True, max_length=200, null=True)),
                ('claim_expires_at', models.DateTimeField(blank=True, null=True)),
                ('closed_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'verbose_name': 'digest bucket',
                'db_table': 'notification_digest',
            },
        ),
        migrations.AddField(
            model_name='notification',
            name='digest_bucket_id',
            field=models.UUIDField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='notification',
            name='digest_closes_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='notification',
            name='digest_id',
            field=models.UUIDField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name='notification',
            name='status',
            field=notifications.models.DomainCharField(choices=[('PENDING', 'Pending'), ('PROCESSING', 'Processing'), ('SENT', 'Sent'), ('FAILED', 'Failed'), ('DEAD_LETTERED', 'Dead Lettered'), ('CANCELLED', 'Cancelled'), ('SUPPRESSED', 'Suppressed'), ('EXPIRED', 'Expired'), ('DIGESTED', 'Digested')], default='PENDING', domain='notification_status', max_length=16),
        ),
        migrations.AlterField(
            model_name='notificationqueue',
            name='status',
            field=models.CharField(choices=[('PENDING', 'Pending'), ('PROCESSING', 'Processing'), ('SENT', 'Sent'), ('FAILED', 'Failed'), ('DEAD_LETTERED', 'Dead Lettered'), ('CANCELLED', 'Cancelled'), ('SUPPRESSED', 'Suppressed'), ('EXPIRED', 'Expired'), ('DIGESTED', 'Digested')], max_length=16),
        ),
        AddIndexConcurrently(
            model_name='notification',
            index=models.Index(condition=models.Q(('digest_bucket_id__isnull', False)), fields=['digest_bucket_id', 'id'], name='notification_digest_items'),
        ),
        migrations.AddField(
            model_name='notificationdigest',
            name='client',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='clients.client'),
        ),
        migrations.AddIndex(
            model_name='notificationdigest',
            index=models.Index(condition=models.Q(('state', 'OPEN')), fields=['closes_at'], name='notification_digest_due'),
        ),
        migrations.AddIndex(
            model_name='notificationdigest',
            index=models.Index(condition=models.Q(('state', 'CLOSING')), fields=['claim_expires_at'], name='notification_digest_closing'),
        ),
        migrations.AddIndex(
            model_name='notificationdigest',
            index=models.Index(fields=['client', '-opened_at'], name='notification_digest_client'),
        ),
        migrations.AddConstraint(
            model_name='notificationdigest',
            constraint=models.UniqueConstraint(condition=models.Q(('state', 'OPEN')), fields=('identity',), name='notification_digest_open'),
        ),
        migrations.RunSQL(
            """
            ALTER DOMAIN notification_status DROP CONSTRAINT notification_status_valid;
            ALTER DOMAIN notification_status ADD CONSTRAINT notification_status_valid
                CHECK (VALUE IN ('PENDING', 'PROCESSING', 'SENT', 'FAILED', 'DEAD_LETTERED',
                                 'CANCELLED', 'SUPPRESSED', 'EXPIRED', 'DIGESTED')) NOT VALID;
            """,
            reverse_sql=migrations.RunSQL.noop,
        ),
        database_objects_create(
            "notifications/sql/functions/notification_digest_create.sql",
            "notifications/sql/functions/notification_digests_claim.sql",
            "notifications/sql/functions/notification_digest_collect.sql",
            "notifications/sql/functions/notification_digest_finish.sql",
        ),
    ]
