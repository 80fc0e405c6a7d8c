"""The finish uses its kept (generic) plan from a connection's first call, and tells which
results freed a rate-limit slot from one hashed look-up.

`notification_finish_many` keeps its statement's plan (migration 0010), but PostgreSQL plans
the first five calls of a connection for their values first, and keeps doing so while those
plans look cheaper than the generic one. Those custom plans know the claim's size but not
that its rows are PROCESSING: the statistics are taken while almost no row is (a claim lasts
milliseconds), so the planner expects one. On a table of 2,500 rows finishing a claim of 250,
they walked the table's whole primary key, filtering by status, and scanned the claim's
results again for each row found: 1,600,000 instructions a row, against 134,000 with the
generic plan, which finds each result's row by its key. The generic plan is now the only one.

Each answered row said whether its slot was freed by an EXISTS over the deleted window rows,
a scan of all of them for every row: nothing when every message was sent (nothing is
deleted), but 250 x 250 comparisons when a provider failed a whole claim. `IN` over the same
rows is looked up in a hash of them, built once.

Both: `bench/pg_instructions.py --statement turn`; docs/performance.md, "Twentieth round";
tests/integration/test_delivery_claims.py.
"""

from importlib import import_module

from django.db import migrations

_before = import_module("notifications.migrations.0021_column_rules_in_domains")
ARGUMENTS = import_module("delivery.migrations.0010_finish_function").ARGUMENTS

FREED_BEFORE = "EXISTS (SELECT 1 FROM uncounted AS u WHERE u.notification_id = f.id)"
FREED = "f.id IN (SELECT u.notification_id FROM uncounted AS u)"
assert _before.FINISH_AFTER.count(FREED_BEFORE) == 1
FINISH = _before.FINISH_AFTER.replace(FREED_BEFORE, FREED)

# After the function: re-creating it keeps only the settings its text names.
GENERIC = f"ALTER FUNCTION notification_finish_many({ARGUMENTS}) SET plan_cache_mode = "
GENERIC += "force_generic_plan;"


class Migration(migrations.Migration):
    dependencies = [
        ("delivery", "0016_outbox_hashed_at_any_size"),
        ("notifications", "0022_create_checked_answers_chosen_columns"),
    ]

    operations = [
        migrations.RunSQL(FINISH + GENERIC, reverse_sql=_before.FINISH_AFTER),
    ]
