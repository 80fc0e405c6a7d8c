from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("notifications", "0005_notifyqueue_now")]

    operations = [
        migrations.AddField(
            model_name="notification",
            name="rate_deferred_from",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
