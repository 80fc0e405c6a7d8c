"""Message templates."""

import django.db.models.deletion
import uuid
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('clients', '0001_initial'),
    ]

    operations = [
        migrations.CreateModel(
            name='MessageTemplate',
            fields=[
                ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('event', models.CharField(help_text='e.g. order_shipped', max_length=255)),
                ('channel', models.CharField(choices=[('email', 'Email'), ('sms', 'Sms'), ('push', 'Push'), ('in_app', 'In App')], max_length=16)),
                ('subject', models.TextField(blank=True, default='')),
                ('body', models.TextField()),
                ('created_at', models.DateTimeField()),
                ('updated_at', models.DateTimeField()),
                ('client', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='clients.client')),
            ],
            options={
                'db_table': 'message_template',
                'constraints': [models.UniqueConstraint(fields=('client', 'event', 'channel'), name='message_template_client_event_channel'), models.CheckConstraint(condition=models.Q(('channel__in', ['email', 'sms', 'push', 'in_app'])), name='message_template_channel_valid')],
            },
        ),
    ]
