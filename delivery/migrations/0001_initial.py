"""What the worker records: delivery attempts, worker heartbeats, the simulated provider's
memory."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    # What this migration stands for in a database migrated before the migrations were
    # squashed: Django then counts it as applied.
    replaces = [
        ('delivery', '0002_notification_triggers'),
        ('delivery', '0003_attempt_outcomes_rerouted_suppressed'),
        ('delivery', '0004_unbounded_provider_answers'),
        ('delivery', '0005_attempt_notification_index_once'),
        ('delivery', '0006_attempt_fillfactor'),
        ('delivery', '0007_outbox_per_statement'),
        ('delivery', '0008_wakeup_when_a_worker_waits'),
        ('delivery', '0009_attempt_notification_unchecked'),
        ('delivery', '0010_finish_function'),
        ('delivery', '0011_inbox_pages_in_order'),
        ('delivery', '0012_inbox_client_index_dropped'),
        ('delivery', '0013_claim_function'),
        ('delivery', '0014_claim_planned_each_call_again'),
        ('delivery', '0015_database_jit_off'),
        ('delivery', '0016_outbox_hashed_at_any_size'),
        ('delivery', '0017_finish_plan_generic_from_the_start'),
        ('delivery', '0018_claim_kept_plan_again'),
        ('delivery', '0019_finish_kept_plan_from_rows_it_can_tell_apart'),
    ]

    dependencies = [
        ('notifications', '0001_initial'),
    ]

    operations = [
        migrations.CreateModel(
            name='SimulatedProviderMessage',
            fields=[
                ('idempotency_key', models.CharField(max_length=300, primary_key=True, serialize=False)),
                ('channel', models.CharField(max_length=16)),
                ('recipient', models.TextField()),
                ('calls', models.PositiveIntegerField(default=0)),
                ('outcome', models.CharField(blank=True, max_length=24, null=True)),
                ('message_id', models.TextField(blank=True, null=True)),
                ('sends', models.PositiveIntegerField(default=0)),
                ('first_call_at', models.DateTimeField()),
                ('last_call_at', models.DateTimeField()),
            ],
            options={
                'db_table': 'simulated_provider_message',
            },
        ),
        migrations.CreateModel(
            name='WorkerHeartbeat',
            fields=[
                ('worker_id', models.CharField(max_length=200, primary_key=True, serialize=False)),
                ('hostname', models.CharField(max_length=255)),
                ('pid', models.PositiveIntegerField()),
                ('started_at', models.DateTimeField()),
                ('last_seen_at', models.DateTimeField()),
                ('stopped_at', models.DateTimeField(blank=True, null=True)),
                ('delivered', models.PositiveBigIntegerField(default=0)),
                ('waiting', models.BooleanField(db_default=False, default=False)),
            ],
            options={
                'db_table': 'worker_heartbeat',
                'indexes': [models.Index(condition=models.Q(('waiting', True)), fields=['worker_id'], name='worker_waiting')],
            },
        ),
        migrations.CreateModel(
            name='DeliveryAttempt',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('claim_token', models.UUIDField(unique=True)),
                ('number', models.PositiveIntegerField()),
                ('channel', models.CharField(max_length=16)),
                ('worker', models.CharField(max_length=200)),
                ('started_at', models.DateTimeField()),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('outcome', models.CharField(blank=True, choices=[('SENT', 'Sent'), ('TEMPORARY_FAILURE', 'Temporary Failure'), ('PERMANENT_FAILURE', 'Permanent Failure'), ('ABANDONED', 'Abandoned'), ('RELEASED', 'Released'), ('RATE_LIMITED', 'Rate Limited'), ('REROUTED', 'Rerouted'), ('SUPPRESSED', 'Suppressed')], max_length=24, null=True)),
                ('error', models.TextField(blank=True, null=True)),
                ('provider_message_id', models.TextField(blank=True, null=True)),
                ('notification', models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='attempts', to='notifications.notification')),
            ],
            options={
                'db_table': 'delivery_attempt',
                'indexes': [models.Index(fields=['notification', 'started_at'], name='attempt_by_notif')],
            },
        ),
        # Room on each page for the finish's update of an attempt row, so it stays HOT.
        migrations.RunSQL(
            "ALTER TABLE delivery_attempt SET (fillfactor = 50);",
            reverse_sql="ALTER TABLE delivery_attempt RESET (fillfactor);",
        ),
    ]
