"""Users' delivery preferences and the in-app inbox, which this app serves."""

import django.db.models.deletion
import uuid
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    # What this migration stands for in a database migrated before the migrations were
    # squashed: Django then counts it as applied.
    replaces = [
        ('preferences', '0002_admin_search_index'),
    ]

    dependencies = [
        ('clients', '0001_initial'),
        ('notifications', '0001_initial'),
    ]

    operations = [
        migrations.CreateModel(
            name='InboxMessage',
            fields=[
                ('id', models.UUIDField(primary_key=True, serialize=False)),
                ('user_id', models.TextField()),
                ('subject', models.TextField(blank=True, default='')),
                ('body', models.TextField()),
                ('metadata', models.JSONField(blank=True, default=dict)),
                ('created_at', models.DateTimeField()),
                ('read_at', models.DateTimeField(blank=True, null=True)),
                ('client', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='clients.client')),
                ('notification', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='inbox_message', to='notifications.notification')),
            ],
            options={
                'db_table': 'inbox_message',
                'indexes': [models.Index(fields=['client', 'user_id', '-created_at', '-id'], name='inbox_by_user'), models.Index(condition=models.Q(('read_at__isnull', True)), fields=['client', 'user_id', '-created_at', '-id'], name='inbox_unread')],
            },
        ),
        migrations.CreateModel(
            name='UserPreferences',
            fields=[
                ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('user_id', models.CharField(max_length=255)),
                ('channels', models.JSONField(default=list, help_text='Ordered; doubles as the fallback chain.')),
                ('addresses', models.JSONField(default=dict, help_text='Channel to address (not in_app).')),
                ('muted_events', models.JSONField(default=list)),
                ('disabled_channels', models.JSONField(default=list)),
                ('created_at', models.DateTimeField()),
                ('updated_at', models.DateTimeField()),
                ('client', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='clients.client')),
            ],
            options={
                'verbose_name_plural': 'user preferences',
                'db_table': 'user_preferences',
                'indexes': [models.Index(fields=['user_id'], name='user_preferences_user')],
                'constraints': [models.UniqueConstraint(fields=('client', 'user_id'), name='user_preferences_client_user')],
            },
        ),
    ]
