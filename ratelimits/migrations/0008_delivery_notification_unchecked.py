"""ratelimit_delivery.notification_id without a foreign-key constraint (issue 12).

The admission records the rows its worker has just claimed; the check at commit locked each of
them FOR KEY SHARE after the claim had updated it. See delivery 0009 for the measurement.
"""
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('notifications', '0012_create_checked_function'),
        ('ratelimits', '0007_admission_cuts'),
    ]

    operations = [
        migrations.AlterField(
            model_name='recipientdelivery',
            name='notification',
            field=models.ForeignKey(db_constraint=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='notifications.notification'),
        ),
    ]
