"""A gathered create statement waits at most 50 ms for another transaction.

`notifications_create_checked_many` (migration 0016) carries creates of several clients. One
of them can meet a key another transaction is inserting (the same client's single create, or
its batch of a thousand, not yet committed) and wait for that transaction to end, and every
create in the statement, and every one queued behind it in the process, waits with it. With
`lock_timeout` set for the function's run, such a wait fails the statement after 50 ms; the
API process then sends each of its creates again alone (notifications/repositories.py,
`CreateCombiner`), and only the create that met the key waits, as a single create always has.
A gathered statement that does not wait takes about a millisecond.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("notifications", "0016_create_checked_many_function")]

    operations = [
        migrations.RunSQL(
            "ALTER FUNCTION notifications_create_checked_many(jsonb) SET lock_timeout = '50ms';",
            reverse_sql="ALTER FUNCTION notifications_create_checked_many(jsonb) RESET lock_timeout;",
        ),
    ]
