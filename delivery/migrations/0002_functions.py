"""The worker's functions and triggers, from `delivery/sql/functions/`: the claim, the finish
and the wake-up; and JIT off for the database.

JIT: the claim's planner cost passes `jit_above_cost` once a large backlog has drained (its
indexes keep pages around a few rows), and each claim was then compiled for longer than it
ran. Nothing this service runs repays a compilation. The setting is the database's, so every
connection takes it (PgBouncer's too). It needs the database's owner or a superuser: without
that the migration warns and goes on (docs/operations.md, "PostgreSQL settings").
"""

from django.db import migrations

from notifyqueue.sqlfile import database_objects_create

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
    # What this migration stands for in a database migrated before the migrations were
    # squashed: Django then counts it as applied.
    replaces = [("delivery", "0020_outbox_skips_statements_that_finish_nothing")]

    dependencies = [
        ("delivery", "0001_initial"),
        ("notifications", "0002_functions"),
        ("preferences", "0001_initial"),
        ("ratelimits", "0001_initial"),
        ("webhooks", "0002_functions"),
    ]

    operations = [
        database_objects_create(
            "delivery/sql/functions/notification_claim_due_many.sql",
            "delivery/sql/functions/notification_finish_many.sql",
            "delivery/sql/functions/notification_wakeup.sql",
        ),
        migrations.RunSQL(
            DATABASE_SETTING.format("SET jit = off"),
            reverse_sql=DATABASE_SETTING.format("RESET jit"),
        ),
    ]
