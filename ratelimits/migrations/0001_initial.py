"""The rate-limit window: one row per delivery admitted, keyed by `ratelimit_key()`."""

import django.db.models.deletion
from django.db import migrations, models

from notifyqueue.sqlfile import database_objects_create


class Migration(migrations.Migration):

    initial = True

    # What this migration stands for in a database migrated before the migrations were
    # squashed: Django then counts it as applied.
    replaces = [
        ('ratelimits', '0002_ratelimit_admit_function'),
        ('ratelimits', '0003_ratelimit_key'),
        ('ratelimits', '0004_critical_releases_nothing'),
        ('ratelimits', '0005_ratelimit_admit_many'),
        ('ratelimits', '0006_ratelimit_admit_set_based'),
        ('ratelimits', '0007_admission_cuts'),
        ('ratelimits', '0008_delivery_notification_unchecked'),
        ('ratelimits', '0009_admission_plans_kept'),
        ('ratelimits', '0010_release_probe_first'),
        ('ratelimits', '0011_admission_no_sequential_scans'),
        ('ratelimits', '0012_recipient_digest'),
        ('ratelimits', '0013_claim_token_primary_key'),
        ('ratelimits', '0014_admission_plans_kept'),
        ('ratelimits', '0015_window_not_truncated_by_vacuum'),
        ('ratelimits', '0016_admission_count_per_row'),
        ('ratelimits', '0017_window_counts_stop_at_the_limit'),
    ]

    dependencies = [
        ('notifications', '0001_initial'),
    ]

    operations = [
        migrations.CreateModel(
            name='RecipientDelivery',
            fields=[
                ('at', models.DateTimeField()),
                ('claim_token', models.UUIDField(primary_key=True, serialize=False)),
                ('notification', models.ForeignKey(db_constraint=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='notifications.notification')),
                ('key', models.BinaryField()),
            ],
            options={
                'db_table': 'ratelimit_delivery',
                'indexes': [models.Index(fields=['key', 'at'], name='ratelimit_key_at'), models.Index(fields=['at'], name='ratelimit_at')],
            },
        ),
        database_objects_create("ratelimits/sql/functions/ratelimit_key.sql"),
        # The primary key's constraint keeps the name Django gave it when the claim token became
        # the key, so that every database has the same schema. Rows come and go with every
        # delivery: VACUUM keeps the empty last pages, since giving them back takes a lock every
        # admission would wait for.
        migrations.RunSQL(
            """
            ALTER TABLE ratelimit_delivery
                RENAME CONSTRAINT ratelimit_delivery_pkey TO ratelimit_delivery_claim_token_146908d2_pk;
            ALTER TABLE ratelimit_delivery SET (vacuum_truncate = false);
            """,
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
