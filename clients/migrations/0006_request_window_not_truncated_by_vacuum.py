"""VACUUM never truncates the API throttle's window table.

Every API request updates its client's row here. When VACUUM gives the table's empty last pages
back, it holds an ACCESS EXCLUSIVE lock, and every request would wait for it, up to a
`deadlock_timeout` (1 s) (the queue table's case, notifications migration 0018). Empty pages
now stay in the table.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("clients", "0005_request_window_unlogged")]

    operations = [
        migrations.RunSQL(
            "ALTER TABLE clients_request_window SET (vacuum_truncate = false);",
            reverse_sql="ALTER TABLE clients_request_window RESET (vacuum_truncate);",
        ),
    ]
