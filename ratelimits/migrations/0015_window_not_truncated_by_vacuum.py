"""VACUUM never truncates the rate-limit window table.

Its rows come and go with every delivery (each admission adds one, forgets those that left
the window), so its last pages are often empty. VACUUM gives such pages back under an ACCESS
EXCLUSIVE lock, and every admission would wait for it, up to a `deadlock_timeout` (1 s)
(the queue table's case, notifications migration 0018). Empty pages now stay in the table.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("ratelimits", "0014_admission_plans_kept")]

    operations = [
        migrations.RunSQL(
            "ALTER TABLE ratelimit_delivery SET (vacuum_truncate = false);",
            reverse_sql="ALTER TABLE ratelimit_delivery RESET (vacuum_truncate);",
        ),
    ]
