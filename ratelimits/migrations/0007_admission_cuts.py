"""Three cuts in a claim's admission, whose rule does not change.

- Each key's window is counted by a probe of `ratelimit_key_at` per key, and the function's
  statements are planned on every call (`plan_cache_mode = force_custom_plan`). PL/pgSQL
  keeps a statement's plan for the connection once five calls have been planned; a plan made
  while the window table was small reads it whole (a sequential scan, cheapest for a few
  pages), and it was kept while the table filled: every delivery of the last window, of every
  recipient, read on every claim (40,000 rows for a claim of 50 in
  `tests/integration/test_ratelimits.py::test_a_claims_admission_counts_each_key_without_reading_the_whole_window`;
  a million with the per-key count and a kept plan). Planned on each call, the estimates
  follow the table's size. Planning the admission's statements costs each claim about as much
  as the throughput lost, within the noise of the drain figures (docs/performance.md).

- `ratelimit_release_next` runs only for a key that has a held row. It looked, for every key
  of the claim that had a slot left, for a row a deferral holds back for that recipient, in a
  function call of its own: 8 µs of PostgreSQL's CPU per delivered row, for keys that almost
  never have one. A probe of the partial index of held rows (`notification_rate_held`) now
  comes first; the function's own look-up asks for the same rows and more conditions, so a
  key it skips is one the function would have found nothing for.
- `ratelimit_key` is STABLE, as `convert_to` in its body is: PostgreSQL inlines a SQL function
  only when the body is no more volatile than the function says it is, so as IMMUTABLE it ran
  as a function call per row. The key depends only on its arguments and the database's
  encoding, which never changes; no index or stored expression uses the function.
"""

from importlib import import_module

from django.db import migrations

BEFORE = import_module("ratelimits.migrations.0006_ratelimit_admit_set_based").ADMIT_MANY

# The freed-slot step's condition, and the probe put before its count.
RELEASE_CONDITION = """
    WHERE NOT last.critical
      AND (SELECT count(*) FROM ratelimit_delivery AS d"""

RELEASE_PROBE = """
    WHERE NOT last.critical
      -- Only a key with a held row has anything to release (notification_rate_held).
      AND EXISTS (SELECT 1 FROM notification AS w
                  WHERE w.recipient = last.recipient AND w.rate_deferred_from IS NOT NULL)
      AND (SELECT count(*) FROM ratelimit_delivery AS d"""

COUNT_STEP_BEFORE = """
    ), counted AS (
        SELECT d.key, count(*) AS in_window
        FROM ratelimit_delivery AS d
        WHERE d.key IN (SELECT DISTINCT key FROM claimed) AND d.at > window_start
        GROUP BY d.key
    ), decided AS ("""

COUNT_STEP = """
    ), counted AS (
        -- One probe of ratelimit_key_at per key of the claim, never the whole window table.
        SELECT k.key, w.in_window
        FROM (SELECT DISTINCT key FROM claimed) AS k
        CROSS JOIN LATERAL (
            SELECT count(*) AS in_window
            FROM ratelimit_delivery AS d
            WHERE d.key = k.key AND d.at > window_start
        ) AS w
    ), decided AS ("""

ARGUMENTS = "text[], uuid[], text[], uuid[], uuid[], boolean[], integer, double precision"

assert BEFORE.count(RELEASE_CONDITION) == 1
assert BEFORE.count(COUNT_STEP_BEFORE) == 1
ADMIT_MANY = BEFORE.replace(RELEASE_CONDITION, RELEASE_PROBE).replace(
    COUNT_STEP_BEFORE, COUNT_STEP
)


class Migration(migrations.Migration):
    dependencies = [("ratelimits", "0006_ratelimit_admit_set_based")]

    operations = [
        migrations.RunSQL(ADMIT_MANY, reverse_sql=BEFORE),
        migrations.RunSQL(
            f"ALTER FUNCTION ratelimit_admit_many({ARGUMENTS}) SET plan_cache_mode = force_custom_plan;",
            reverse_sql=f"ALTER FUNCTION ratelimit_admit_many({ARGUMENTS}) RESET plan_cache_mode;",
        ),
        migrations.RunSQL(
            "ALTER FUNCTION ratelimit_key(text, uuid, text) STABLE;",
            reverse_sql="ALTER FUNCTION ratelimit_key(text, uuid, text) IMMUTABLE;",
        ),
    ]
