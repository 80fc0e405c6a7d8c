"""VACUUM never truncates the queue table.

When the last pages of a table are empty, VACUUM (and autovacuum) gives them back to the
operating system, under an ACCESS EXCLUSIVE lock on the table. On `notification_queue` every
create (through its trigger), claim and finish waits for that lock. The benchmark's server log
caught autovacuum truncating the queue while single creates arrived at 200 a second. The
creates waited a whole `deadlock_timeout` (1 s), until the waiting backend cancelled the
autovacuum: p95 734 ms, p99 1,013 ms in one latency repeat of three (docs/performance.md,
"Fourteenth round"). Empty pages now stay in the table and are reused by the next rows.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("notifications", "0017_gathered_create_lock_timeout")]

    operations = [
        migrations.RunSQL(
            "ALTER TABLE notification_queue SET (vacuum_truncate = false);",
            reverse_sql="ALTER TABLE notification_queue RESET (vacuum_truncate);",
        ),
    ]
