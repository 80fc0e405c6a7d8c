"""Django's plain index on an inbox message's client goes: inbox_by_user (client, user_id,
...) serves every lookup by client, and an in-app delivery writes one index entry fewer."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('clients', '0005_request_window_unlogged'),
        ('delivery', '0011_inbox_pages_in_order'),
    ]

    operations = [
        migrations.AlterField(
            model_name='inboxmessage',
            name='client',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='clients.client'),
        ),
    ]
