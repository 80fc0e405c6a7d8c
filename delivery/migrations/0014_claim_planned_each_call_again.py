"""The claim is planned on every call again: `notification_claim_due_many` (migration 0013) goes.

Its plan, kept per server connection, was right in every test and on one connection, yet in
the benchmark's two-worker drain claims slowed to a quarter of a second each for seconds on
end, in three drains of thirteen; the one caught in the server's log started just after a
worker's statistics refresh analyzed the queue in the middle of a burst (docs/performance.md,
"Thirteenth round"). Planned on each call, eight drains never did. The claim is the statement in delivery/sql/queries.sql, as before migration 0013.
"""

from importlib import import_module

from django.db import migrations

_kept = import_module("delivery.migrations.0013_claim_function")


class Migration(migrations.Migration):
    dependencies = [("delivery", "0013_claim_function")]

    operations = [
        migrations.RunSQL(
            f"DROP FUNCTION notification_claim_due_many({_kept.ARGUMENTS});",
            reverse_sql=_kept.FUNCTION,
        ),
    ]
