"""The admission counts per (client, recipient) with the recipient's counting form, and with the
ceiling on per address across clients; a freed slot releases the key's own held rows."""

from django.db import migrations

from notifyqueue.sqlfile import database_objects_reload


class Migration(migrations.Migration):
    dependencies = [
        ("notifications", "0003_ratelimit_release_freed"),
        ("ratelimits", "0002_windows_per_client"),
    ]

    operations = [
        # New parameters: the old signatures are dropped, not left beside the new ones (a
        # database migrated from scratch made only the new ones: the earlier migrations load
        # the files as they are now).
        migrations.RunSQL(
            """
            DROP FUNCTION IF EXISTS ratelimit_admit(text, uuid, text, uuid, uuid, integer,
                                          double precision, boolean);
            DROP FUNCTION IF EXISTS ratelimit_admit_many(text[], uuid[], text[], uuid[], uuid[], boolean[],
                                               integer, double precision);
            """,
            reverse_sql=migrations.RunSQL.noop,
        ),
        database_objects_reload(
            "notifications/sql/functions/ratelimit_release_next.sql",
            "notifications/sql/functions/ratelimit_admit_many.sql",
            "notifications/sql/functions/ratelimit_admit.sql",
        ),
    ]
