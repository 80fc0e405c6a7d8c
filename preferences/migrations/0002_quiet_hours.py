"""Quiet hours: a user's time zone and windows of local time, with defaults in the database so
that a process of the previous release, which names neither column, keeps writing preferences;
and the function that says until when a window holds a message (`quiet_hours_until`)."""

from django.db import migrations, models

from notifyqueue.sqlfile import database_objects_create


class Migration(migrations.Migration):

    dependencies = [
        ('preferences', '0001_initial'),
    ]

    operations = [
        migrations.AddField(
            model_name='userpreferences',
            name='quiet_hours',
            field=models.JSONField(blank=True, db_default=[], default=list),
        ),
        migrations.AddField(
            model_name='userpreferences',
            name='timezone',
            field=models.CharField(db_default='UTC', default='UTC', max_length=64),
        ),
        database_objects_create(
            "preferences/sql/functions/quiet_hours_wall_instant.sql",
            "preferences/sql/functions/quiet_hours_until.sql",
        ),
    ]
