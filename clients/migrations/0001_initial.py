"""API clients, their keys and the API throttle's window; and the SQL functions every app uses
(`notifyqueue/sql/functions/`: the project package has no migrations, and this app's are the
first to run)."""

import clients.models
import django.db.models.deletion
import notifyqueue.webhook_url
import uuid
from django.db import migrations, models

from notifyqueue.sqlfile import database_objects_create


class Migration(migrations.Migration):

    initial = True

    # What this migration stands for in a database migrated before the migrations were
    # squashed: Django then counts it as applied.
    replaces = [
        ('clients', '0002_client_webhook_secret_rotation'),
        ('clients', '0003_client_request_window'),
        ('clients', '0004_client_may_send_critical'),
        ('clients', '0005_request_window_unlogged'),
        ('clients', '0006_request_window_not_truncated_by_vacuum'),
    ]

    dependencies = [
    ]

    operations = [
        migrations.CreateModel(
            name='Client',
            fields=[
                ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('name', models.CharField(max_length=100, unique=True)),
                ('is_operator', models.BooleanField(default=False, help_text="Operators see every client's notifications and may retry them.")),
                ('webhook_url', models.URLField(blank=True, default='', max_length=2000, validators=[notifyqueue.webhook_url.webhook_url_validate])),
                ('webhook_secret', models.CharField(default=clients.models.webhook_secret_new, max_length=100)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('previous_webhook_secret', models.CharField(blank=True, db_default='', default='', max_length=100)),
                ('previous_webhook_secret_expires_at', models.DateTimeField(blank=True, null=True)),
                ('may_send_critical', models.BooleanField(default=False, help_text="May create CRITICAL notifications, which go before every other client's and are never rate-limited. Off for new clients.")),
            ],
            options={
                'ordering': ['name'],
            },
        ),
        migrations.CreateModel(
            name='ClientRequestWindow',
            fields=[
                ('client', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name='+', serialize=False, to='clients.client')),
                ('window_start', models.DateTimeField()),
                ('requests', models.IntegerField()),
            ],
            options={
                'db_table': 'clients_request_window',
            },
        ),
        migrations.CreateModel(
            name='ClientAPIKey',
            fields=[
                ('id', models.CharField(editable=False, max_length=150, primary_key=True, serialize=False, unique=True)),
                ('prefix', models.CharField(editable=False, max_length=8, unique=True)),
                ('hashed_key', models.CharField(editable=False, max_length=150)),
                ('created', models.DateTimeField(auto_now_add=True, db_index=True)),
                ('name', models.CharField(default=None, help_text='A free-form name for the API key. Need not be unique. 50 characters max.', max_length=50)),
                ('revoked', models.BooleanField(blank=True, default=False, help_text='If the API key is revoked, clients cannot use it anymore. (This cannot be undone.)')),
                ('expiry_date', models.DateTimeField(blank=True, help_text='Once API key expires, clients cannot use it anymore.', null=True, verbose_name='Expires')),
                ('client', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='api_keys', to='clients.client')),
            ],
            options={
                'verbose_name': 'API key',
                'verbose_name_plural': 'API keys',
                'ordering': ('-created',),
                'abstract': False,
            },
        ),
        database_objects_create(
            "notifyqueue/sql/functions/notifyqueue_now.sql",
            "notifyqueue/sql/functions/notifyqueue_uuid7.sql",
        ),
        # The throttle's counters make no WAL, so a request's count never waits for a flush;
        # after a crash every count starts again, which a throttle can afford. VACUUM keeps
        # the empty last pages: giving them back takes a lock every request would wait for.
        migrations.RunSQL(
            "ALTER TABLE clients_request_window SET UNLOGGED, SET (vacuum_truncate = false);",
            reverse_sql="ALTER TABLE clients_request_window SET LOGGED, RESET (vacuum_truncate);",
        ),
    ]
