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
        # Two new parameters at the end, with defaults: the old signatures are dropped, not left
        # beside the new ones, and a worker of the previous release calls the new ones through
        # the same statement (this migration is one transaction). A database migrated from
        # scratch has only the new ones: the earlier migrations load the files as they are now.
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
