"""The webhook outbox trigger plans its NOT IN with `work_mem` of its own.

The trigger (migration 0007) finds the rows whose status a statement changed with
`(id, status) NOT IN (SELECT id, status FROM outbox_old)`, which PostgreSQL runs as a hash of
the old rows only when it expects them to fit in `work_mem` (times `hash_mem_multiplier`);
otherwise it compares every new row with every old one. The trigger's plan is made at its first
run in a session, from that statement's row count, and kept. A session whose first such
statement changed more rows than fit (about 150,000 at the default 4 MB) ran it in quadratic
time: 200,000 rows marked SENT in one UPDATE had not finished after ten minutes, against
0.74 s for 100,000 (docs/performance.md, "Sixteenth round").

With 256 MB for the trigger's own planning and run, the hash is chosen for statements up to
millions of rows. The hash holds the statement's actual old rows, so a claim's or a finish's
hundred rows take what they always took; only a statement that really changes millions of rows
uses that much.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("delivery", "0015_database_jit_off")]

    operations = [
        migrations.RunSQL(
            "ALTER FUNCTION notification_webhook_outbox() SET work_mem = '256MB';",
            reverse_sql="ALTER FUNCTION notification_webhook_outbox() RESET work_mem;",
        ),
    ]
