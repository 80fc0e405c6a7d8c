"""The webhook outbox trigger returns at once from a statement that made nothing final.

It runs after every UPDATE of `notification` (a trigger with transition tables cannot name
columns, migration 0007), and most of those make nothing final: every claim, every deferral,
every retry scheduled. Each still ran the outbox's INSERT, which found no rows and fired the
statement triggers of `webhook_event` all the same (its queue's insert trigger, migration
webhooks 0006): about 30,000 of PostgreSQL's instructions added to a one-row claim and to a
one-row finish (docs/performance.md, "Twenty-third round"). The trigger now looks for a row
whose new status is a reported one first, and inserts only when there is one.

CREATE OR REPLACE resets the function's settings, so `work_mem` (migration 0016) is set again.
"""

from importlib import import_module

from django.db import migrations

_0007 = import_module("delivery.migrations.0007_outbox_per_statement").PER_STATEMENT
UNGUARDED = (
    _0007[_0007.index("CREATE OR REPLACE FUNCTION") : _0007.index("CREATE TRIGGER")]
    + "ALTER FUNCTION notification_webhook_outbox() SET work_mem = '256MB';\n"
)

GUARD = """    IF NOT EXISTS (SELECT FROM outbox_new
                   WHERE status IN ('SENT', 'FAILED', 'DEAD_LETTERED', 'SUPPRESSED')) THEN
        RETURN NULL;
    END IF;
"""
GUARDED = UNGUARDED.replace("BEGIN\n", "BEGIN\n" + GUARD, 1)


class Migration(migrations.Migration):
    dependencies = [("delivery", "0019_finish_kept_plan_from_rows_it_can_tell_apart")]

    operations = [migrations.RunSQL(GUARDED, reverse_sql=UNGUARDED)]
