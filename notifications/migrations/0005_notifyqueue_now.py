"""`notifyqueue_now()`: the one clock every process agrees on.

Due times, claim expiry, reaping and rate windows are decided in SQL against this function,
never against the clock of the worker or API server that runs the statement: hosts drift, and a
worker whose clock runs fast must not send a delayed message early or take over a live claim.
It is `statement_timestamp()` (the database server's clock when the statement began). Tests
move time by replacing the function (`tests/support/clock.py`), from the database side, so every process
and connection sees the same moved clock.
"""

from django.db import migrations

FUNCTION = """
CREATE OR REPLACE FUNCTION notifyqueue_now() RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$ SELECT statement_timestamp() $$;
"""


class Migration(migrations.Migration):
    dependencies = [("notifications", "0004_drop_client_fk_index")]

    operations = [
        migrations.RunSQL(FUNCTION, reverse_sql="DROP FUNCTION notifyqueue_now();"),
    ]
