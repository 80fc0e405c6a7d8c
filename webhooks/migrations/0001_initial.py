"""Webhook events, their delivery attempts, and the queue of events not yet final (kept equal
to the events by the triggers of 0002_functions)."""

import django.db.models.deletion
import uuid
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    # What this migration stands for in a database migrated before the migrations were
    # squashed: Django then counts it as applied.
    replaces = [
        ('webhooks', '0002_webhook_delivery_attempt'),
        ('webhooks', '0003_fair_claim_indexes'),
        ('webhooks', '0004_event_notification_unchecked'),
        ('webhooks', '0005_admin_list_indexes'),
        ('webhooks', '0006_queue_table'),
    ]

    dependencies = [
        ('clients', '0001_initial'),
        ('notifications', '0001_initial'),
    ]

    operations = [
        migrations.CreateModel(
            name='WebhookEvent',
            fields=[
                ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('status', models.CharField(choices=[('SENT', 'SENT'), ('FAILED', 'FAILED'), ('DEAD_LETTERED', 'DEAD_LETTERED'), ('SUPPRESSED', 'SUPPRESSED')], max_length=16)),
                ('attempt_count', models.PositiveIntegerField()),
                ('occurred_at', models.DateTimeField()),
                ('state', models.CharField(choices=[('PENDING', 'Pending'), ('DELIVERING', 'Delivering'), ('DELIVERED', 'Delivered'), ('FAILED', 'Failed')], default='PENDING', max_length=16)),
                ('delivery_attempts', models.PositiveIntegerField(default=0)),
                ('next_attempt_at', models.DateTimeField()),
                ('claim_token', models.UUIDField(blank=True, null=True)),
                ('claim_expires_at', models.DateTimeField(blank=True, null=True)),
                ('last_error', models.TextField(blank=True, null=True)),
                ('last_status_code', models.PositiveSmallIntegerField(blank=True, null=True)),
                ('delivered_at', models.DateTimeField(blank=True, null=True)),
                ('created_at', models.DateTimeField()),
                ('client', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='clients.client')),
                ('notification', models.ForeignKey(db_constraint=False, on_delete=django.db.models.deletion.CASCADE, related_name='webhook_events', to='notifications.notification')),
                ('redeliveries', models.PositiveIntegerField(db_default=0, default=0)),
            ],
            options={
                'db_table': 'webhook_event',
                'permissions': [('redeliver_webhookevent', 'Can redeliver webhook events')],
            },
        ),
        migrations.CreateModel(
            name='WebhookDeliveryAttempt',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('claim_token', models.UUIDField(unique=True)),
                ('number', models.PositiveIntegerField()),
                ('url', models.CharField(max_length=2000)),
                ('started_at', models.DateTimeField()),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('outcome', models.CharField(blank=True, choices=[('DELIVERED', 'Delivered'), ('TEMPORARY_FAILURE', 'Temporary Failure'), ('PERMANENT_FAILURE', 'Permanent Failure'), ('ABANDONED', 'Abandoned')], max_length=24, null=True)),
                ('status_code', models.PositiveSmallIntegerField(blank=True, null=True)),
                ('error', models.TextField(blank=True, null=True)),
                ('duration_ms', models.PositiveIntegerField(blank=True, null=True)),
                ('event', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='attempts', to='webhooks.webhookevent')),
            ],
            options={
                'db_table': 'webhook_delivery_attempt',
            },
        ),
        migrations.CreateModel(
            name='WebhookQueueEntry',
            fields=[
                ('event', models.OneToOneField(db_column='id', db_constraint=False, on_delete=django.db.models.deletion.DO_NOTHING, primary_key=True, related_name='queue_entry', serialize=False, to='webhooks.webhookevent')),
                ('client_id', models.UUIDField()),
                ('state', models.CharField(choices=[('PENDING', 'PENDING'), ('DELIVERING', 'DELIVERING')], max_length=16)),
                ('next_attempt_at', models.DateTimeField()),
                ('created_at', models.DateTimeField()),
                ('claim_expires_at', models.DateTimeField(null=True)),
            ],
            options={
                'db_table': 'webhook_queue',
                'indexes': [models.Index(condition=models.Q(('state', 'PENDING')), fields=['next_attempt_at'], name='webhook_queue_due'), models.Index(condition=models.Q(('state', 'DELIVERING')), fields=['claim_expires_at'], name='webhook_queue_claim_expiry'), models.Index(condition=models.Q(('state', 'PENDING')), fields=['client_id', 'next_attempt_at', 'created_at'], name='webhook_queue_client_due'), models.Index(condition=models.Q(('state', 'DELIVERING')), fields=['client_id'], name='webhook_queue_client_busy')],
            },
        ),
        migrations.AddIndex(
            model_name='webhookevent',
            index=models.Index(fields=['-created_at', '-id'], name='webhook_event_recent'),
        ),
        migrations.AddIndex(
            model_name='webhookevent',
            index=models.Index(fields=['client', '-created_at', '-id'], name='webhook_event_client_recent'),
        ),
        migrations.AddIndex(
            model_name='webhookevent',
            index=models.Index(condition=models.Q(('state', 'FAILED')), fields=['-created_at', '-id'], name='webhook_event_failed'),
        ),
        migrations.AddConstraint(
            model_name='webhookevent',
            constraint=models.CheckConstraint(condition=models.Q(('state__in', ['PENDING', 'DELIVERING', 'DELIVERED', 'FAILED'])), name='webhook_event_state_valid'),
        ),
        migrations.AddConstraint(
            model_name='webhookevent',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('claim_expires_at__isnull', False), ('claim_token__isnull', False), ('state', 'DELIVERING')), models.Q(models.Q(('state', 'DELIVERING'), _negated=True), ('claim_expires_at__isnull', True), ('claim_token__isnull', True)), _connector='OR'), name='webhook_event_claim_iff_delivering'),
        ),
        migrations.AddConstraint(
            model_name='webhookdeliveryattempt',
            constraint=models.UniqueConstraint(fields=('event', 'number'), name='webhook_delivery_attempt_event_number'),
        ),
        migrations.AddConstraint(
            model_name='webhookdeliveryattempt',
            constraint=models.CheckConstraint(condition=models.Q(('outcome__in', ['DELIVERED', 'TEMPORARY_FAILURE', 'PERMANENT_FAILURE', 'ABANDONED']), ('outcome__isnull', True), _connector='OR'), name='webhook_delivery_attempt_outcome_valid'),
        ),
        # The queue changes all the time: vacuumed early, and VACUUM keeps its empty last
        # pages, since giving them back takes a lock every claim and finish would wait for.
        migrations.RunSQL(
            """
            ALTER TABLE webhook_queue SET (autovacuum_vacuum_scale_factor = 0.05,
                                           autovacuum_vacuum_threshold = 1000,
                                           vacuum_truncate = false);
            """,
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
