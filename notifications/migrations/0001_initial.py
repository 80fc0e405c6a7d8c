"""The notification record and its queue table: the record keeps every notification, the queue
only the rows not yet SENT (kept equal to the record by the triggers of 0002_functions), which
hold every index that names a status, a due time or a claim."""

import django.db.models.deletion
import django.db.models.expressions
import django.db.models.functions.comparison
import django.db.models.functions.text
import notifications.models
import uuid
from django.db import migrations, models

# The notification table's one-column rules are its domains' CHECKs, which PostgreSQL reads
# once per connection (a table's CHECKs are prepared again for every statement that writes
# it). NOT VALID, as in databases that gained them on a full table: every value written is
# checked all the same.
DOMAINS = """
CREATE DOMAIN notification_status AS varchar(16);
CREATE DOMAIN notification_channel AS varchar(16);
CREATE DOMAIN notification_priority AS smallint;
CREATE DOMAIN notification_count AS integer;
ALTER DOMAIN notification_status ADD CONSTRAINT notification_status_valid
    CHECK (VALUE IN ('PENDING', 'PROCESSING', 'SENT', 'FAILED', 'DEAD_LETTERED', 'CANCELLED',
                     'SUPPRESSED')) NOT VALID;
ALTER DOMAIN notification_channel ADD CONSTRAINT notification_channel_valid
    CHECK (VALUE IN ('email', 'sms', 'push', 'in_app')) NOT VALID;
ALTER DOMAIN notification_priority ADD CONSTRAINT notification_priority_valid
    CHECK (VALUE BETWEEN 0 AND 3) NOT VALID;
ALTER DOMAIN notification_count ADD CONSTRAINT notification_count_not_negative
    CHECK (VALUE >= 0) NOT VALID;
"""


class Migration(migrations.Migration):

    initial = True

    # What this migration stands for in a database migrated before the migrations were
    # squashed: Django then counts it as applied.
    replaces = [
        ('notifications', '0002_api_indexes_long_recipient'),
        ('notifications', '0003_operator_retry'),
        ('notifications', '0004_drop_client_fk_index'),
        ('notifications', '0005_notifyqueue_now'),
        ('notifications', '0006_rate_deferred_from'),
        ('notifications', '0007_pending_client_index'),
        ('notifications', '0008_rate_held_index'),
        ('notifications', '0009_queue_table'),
        ('notifications', '0010_record_fillfactor_50'),
        ('notifications', '0011_notification_uuid7'),
        ('notifications', '0012_create_checked_function'),
        ('notifications', '0013_recipient_digest_btree'),
        ('notifications', '0014_queue_recipient_digest'),
        ('notifications', '0015_cancelled_rows_not_held'),
        ('notifications', '0016_create_checked_many_function'),
        ('notifications', '0017_gathered_create_lock_timeout'),
        ('notifications', '0018_queue_not_truncated_by_vacuum'),
        ('notifications', '0019_queue_triggers_find_rows_by_key'),
        ('notifications', '0020_pending_count_by_index'),
        ('notifications', '0021_column_rules_in_domains'),
        ('notifications', '0022_create_checked_answers_chosen_columns'),
    ]

    dependencies = [
        ('clients', '0001_initial'),
    ]

    operations = [
        migrations.RunSQL(
            DOMAINS,
            reverse_sql="DROP DOMAIN notification_status, notification_channel, "
            "notification_priority, notification_count;",
        ),
        migrations.CreateModel(
            name='Notification',
            fields=[
                ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('idempotency_key', models.CharField(max_length=255)),
                ('request_fingerprint', models.CharField(max_length=64)),
                ('channel', notifications.models.DomainCharField(choices=[('email', 'Email'), ('sms', 'Sms'), ('push', 'Push'), ('in_app', 'In App')], domain='notification_channel', max_length=16)),
                ('recipient', models.CharField(max_length=4096)),
                ('subject', models.TextField(blank=True, default='')),
                ('body', models.TextField()),
                ('priority', notifications.models.DomainSmallIntegerField(choices=[(0, 'Critical'), (1, 'High'), (2, 'Normal'), (3, 'Low')], default=2, domain='notification_priority')),
                ('metadata', models.JSONField(blank=True, default=dict)),
                ('user_id', models.CharField(blank=True, max_length=255, null=True)),
                ('template', models.CharField(blank=True, max_length=255, null=True)),
                ('payload', models.JSONField(blank=True, null=True)),
                ('fallback_channels', models.JSONField(blank=True, default=list)),
                ('status', notifications.models.DomainCharField(choices=[('PENDING', 'Pending'), ('PROCESSING', 'Processing'), ('SENT', 'Sent'), ('FAILED', 'Failed'), ('DEAD_LETTERED', 'Dead Lettered'), ('CANCELLED', 'Cancelled'), ('SUPPRESSED', 'Suppressed')], default='PENDING', domain='notification_status', max_length=16)),
                ('send_at', models.DateTimeField()),
                ('due_at', models.DateTimeField()),
                ('attempt_count', notifications.models.DomainPositiveIntegerField(default=0, domain='notification_count')),
                ('max_attempts', notifications.models.DomainPositiveIntegerField(domain='notification_count')),
                ('last_error', models.TextField(blank=True, null=True)),
                ('sent_at', models.DateTimeField(blank=True, null=True)),
                ('operator_retries', notifications.models.DomainPositiveIntegerField(default=0, domain='notification_count')),
                ('claim_token', models.UUIDField(blank=True, null=True)),
                ('claimed_by', models.CharField(blank=True, max_length=200, null=True)),
                ('claim_expires_at', models.DateTimeField(blank=True, null=True)),
                ('created_at', models.DateTimeField()),
                ('updated_at', models.DateTimeField()),
                ('client', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='clients.client')),
                ('last_retried_at', models.DateTimeField(blank=True, null=True)),
                ('last_retried_by', models.CharField(blank=True, max_length=255, null=True)),
                ('rate_deferred_from', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'db_table': 'notification',
                'permissions': [('retry_notification', 'Can retry failed and dead-lettered notifications'), ('cancel_notification', 'Can cancel pending notifications')],
            },
        ),
        migrations.CreateModel(
            name='NotificationQueue',
            fields=[
                ('notification', models.OneToOneField(db_column='id', db_constraint=False, on_delete=django.db.models.deletion.DO_NOTHING, primary_key=True, related_name='queue_entry', serialize=False, to='notifications.notification')),
                ('client_id', models.UUIDField()),
                ('status', models.CharField(choices=[('PENDING', 'Pending'), ('PROCESSING', 'Processing'), ('SENT', 'Sent'), ('FAILED', 'Failed'), ('DEAD_LETTERED', 'Dead Lettered'), ('CANCELLED', 'Cancelled'), ('SUPPRESSED', 'Suppressed')], max_length=16)),
                ('priority', models.SmallIntegerField(choices=[(0, 'Critical'), (1, 'High'), (2, 'Normal'), (3, 'Low')])),
                ('channel', models.CharField(choices=[('email', 'Email'), ('sms', 'Sms'), ('push', 'Push'), ('in_app', 'In App')], max_length=16)),
                ('due_at', models.DateTimeField()),
                ('created_at', models.DateTimeField()),
                ('claim_expires_at', models.DateTimeField(null=True)),
                ('recipient_digest', models.UUIDField(null=True)),
            ],
            options={
                'db_table': 'notification_queue',
                'indexes': [models.Index(condition=models.Q(('status', 'PENDING')), fields=['recipient_digest'], name='queue_pending_recipient'), models.Index(condition=models.Q(('status', 'PENDING')), fields=['priority', 'client_id', 'due_at', 'created_at'], name='queue_pending_client'), models.Index(condition=models.Q(('status', 'PENDING')), fields=['priority', 'due_at'], name='queue_pending_due'), models.Index(condition=models.Q(('status', 'PROCESSING')), fields=['claim_expires_at'], name='queue_claim_expiry'), models.Index(condition=models.Q(('status', 'PROCESSING'), _negated=True), fields=['client_id', 'status', '-created_at', '-notification'], name='queue_client_status'), models.Index(condition=models.Q(('status', 'PROCESSING'), _negated=True), fields=['status', 'created_at', 'notification'], include=('channel', 'priority'), name='queue_status')],
            },
        ),
        migrations.AddIndex(
            model_name='notification',
            index=models.Index(fields=['client', '-created_at', '-id'], name='notification_client_list'),
        ),
        migrations.AddIndex(
            model_name='notification',
            index=models.Index(fields=['-created_at', '-id'], name='notification_recent'),
        ),
        migrations.AddIndex(
            model_name='notification',
            index=models.Index(django.db.models.functions.comparison.Cast(django.db.models.functions.text.MD5(models.F('recipient')), output_field=models.UUIDField()), models.F('client'), models.OrderBy(models.F('created_at'), descending=True), models.OrderBy(models.F('id'), descending=True), name='notification_recipient'),
        ),
        migrations.AddIndex(
            model_name='notification',
            index=models.Index(django.db.models.functions.comparison.Cast(django.db.models.functions.text.MD5(models.F('recipient')), output_field=models.UUIDField()), condition=models.Q(('rate_deferred_from__isnull', False)), name='notification_rate_held'),
        ),
        migrations.AddIndex(
            model_name='notification',
            index=models.Index(fields=['idempotency_key'], name='notification_idempotency_key'),
        ),
        migrations.AddConstraint(
            model_name='notification',
            constraint=models.UniqueConstraint(fields=('client', 'idempotency_key'), name='notification_client_idempotency_key'),
        ),
        migrations.AddConstraint(
            model_name='notification',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('claim_expires_at__isnull', False), ('claim_token__isnull', False), ('claimed_by__isnull', False), ('status', 'PROCESSING')), models.Q(models.Q(('status', 'PROCESSING'), _negated=True), ('claim_expires_at__isnull', True), ('claim_token__isnull', True)), _connector='OR'), name='notification_claim_iff_processing'),
        ),
        migrations.AddConstraint(
            model_name='notification',
            constraint=models.CheckConstraint(condition=models.Q(('attempt_count__lte', django.db.models.expressions.CombinedExpression(models.F('max_attempts'), '+', models.Value(1)))), name='notification_attempts_bounded'),
        ),
        # Half of each page of the record left free, so that a claim's and a finish's new row
        # versions stay on their page (HOT) and write no index entry. The queue tables change
        # all the time: vacuumed early, and VACUUM keeps their empty last pages, since giving
        # them back takes a lock that every create, claim and finish would wait for.
        migrations.RunSQL(
            """
            ALTER TABLE notification SET (fillfactor = 50);
            ALTER TABLE notification_queue SET (autovacuum_vacuum_scale_factor = 0.05,
                                                autovacuum_vacuum_threshold = 1000,
                                                vacuum_truncate = false);
            """,
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
