"""delivery_attempt.notification_id without a foreign-key constraint (issue 12).

Django's foreign keys are checked at commit (DEFERRABLE INITIALLY DEFERRED), one look-up per
row that locks the notification FOR KEY SHARE. The claim updates that notification and inserts
its attempt in one statement, so the check's lock met the claim's own update in every row: a
MultiXact per message, created and read again by the finish. Two workers drained 9,950-11,460
rows a second without the checks of this table and ratelimit_delivery, against 8,450-9,480 with
them (docs/performance.md, "Sixth round"). The claim writes each attempt from the row it
updates, so the row exists; retention deletes attempts before their notifications, and the ORM
still cascades (docs/technical-design.md, "Foreign keys the hot path does not check").
"""
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('delivery', '0008_wakeup_when_a_worker_waits'),
        ('notifications', '0012_create_checked_function'),
    ]

    operations = [
        migrations.AlterField(
            model_name='deliveryattempt',
            name='notification',
            field=models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='attempts', to='notifications.notification'),
        ),
    ]
