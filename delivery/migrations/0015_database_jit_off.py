"""Sessions of the service's database run without JIT compilation.

PostgreSQL compiles a statement's expressions to machine code when the planner's cost for it
is above `jit_above_cost` (100,000 by default). The cost of the worker's claim is a planner
estimate, and after a large backlog has drained it passes that line: the queue's indexes keep
their pages around a handful of rows, every probe of them is priced at hundreds of pages, and
the claim came out at 200,000. On a server built with LLVM (Debian's and most hosted ones),
each claim was then compiled before it ran: 52 ms of emission for a statement that read its 9
rows in 3 ms, claim after claim, latency p50 56 ms at 200 creates a second
(docs/performance.md, "Sixteenth round"). Nothing this service runs is long enough for
compiled code to repay its compilation.

The setting is the database's, so it holds for every connection (direct, or PgBouncer's in
transaction mode, which starts its server sessions with the database's settings), and a new
session takes it. Changing a database's settings needs its owner or a superuser: without
that the migration warns and goes on, and operations.md says how to set it by hand.
"""

from django.db import migrations

DATABASE_SETTING = """
DO $$
BEGIN
    EXECUTE format('ALTER DATABASE %I {}', current_database());
EXCEPTION WHEN insufficient_privilege THEN
    RAISE WARNING 'JIT is left as it is for database %: % (docs/operations.md, "PostgreSQL '
                  'settings")', current_database(), SQLERRM;
END $$;
"""


class Migration(migrations.Migration):
    dependencies = [("delivery", "0014_claim_planned_each_call_again")]

    operations = [
        migrations.RunSQL(
            DATABASE_SETTING.format("SET jit = off"),
            reverse_sql=DATABASE_SETTING.format("RESET jit"),
        ),
    ]
