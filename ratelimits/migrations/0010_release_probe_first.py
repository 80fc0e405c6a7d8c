"""The admission counts a key's window for a release only when the key has a held row; its
statements are planned on every call again.

After a claim's admission, a key with a slot left lets its next held row go
(`ratelimit_release_next`), and migration 0007 put a probe of `notification_rate_held` before
that count so that keys without a held row (almost all) would skip it. The planner turned
the probe into a semi-join and kept the count as a filter before it: every key of every claim
still had its window counted, 0.6 ms a claim of 100 of a 1.1 ms statement (`EXPLAIN ANALYZE`,
docs/performance.md, "Seventh round"). The probe now runs in a subquery the planner keeps
apart (`OFFSET 0`), and only the keys it returns have their window counted. The rule does not
change.

Migration 0009 had the function's plans kept per connection, with sequential scans off. The
test suite then showed a kept plan counting the keys' windows without reading one entry of
`ratelimit_key_at` (so through another index, `ratelimit_at` being the one that fits: every
delivery of the window, filtered by key), the statistics at planning time making that look
cheap: with sequential scans off a kept plan still chooses
between indexes once and for all. Re-creating the function resets its settings; it is planned
on every call again (`plan_cache_mode = force_custom_plan`, as migration 0007 had it), where
each call's plan sees the key it counts.
"""

from importlib import import_module

from django.db import migrations

BEFORE = import_module("ratelimits.migrations.0007_admission_cuts").ADMIT_MANY

RELEASE_BEFORE = """
    PERFORM ratelimit_release_next(last.channel, last.client_id, last.recipient, last.id)
    FROM (
        SELECT DISTINCT ON (c.key) c.key, c.channel, c.client_id, c.recipient, c.id, c.critical
        FROM unnest(p_channels, p_clients, p_recipients, p_notifications, p_criticals, keys)
             AS c(channel, client_id, recipient, id, critical, key)
        ORDER BY c.key, c.id DESC
    ) AS last
    WHERE NOT last.critical
      -- Only a key with a held row has anything to release (notification_rate_held).
      AND EXISTS (SELECT 1 FROM notification AS w
                  WHERE w.recipient = last.recipient AND w.rate_deferred_from IS NOT NULL)
      AND (SELECT count(*) FROM ratelimit_delivery AS d
           WHERE d.key = last.key AND d.at > window_start) < p_limit;"""

RELEASE = """
    PERFORM ratelimit_release_next(held.channel, held.client_id, held.recipient, held.id)
    FROM (
        SELECT last.*
        FROM (
            SELECT DISTINCT ON (c.key) c.key, c.channel, c.client_id, c.recipient, c.id,
                   c.critical
            FROM unnest(p_channels, p_clients, p_recipients, p_notifications, p_criticals, keys)
                 AS c(channel, client_id, recipient, id, critical, key)
            ORDER BY c.key, c.id DESC
        ) AS last
        WHERE NOT last.critical
          -- Only a key with a held row has anything to release (notification_rate_held).
          AND EXISTS (SELECT 1 FROM notification AS w
                      WHERE w.recipient = last.recipient AND w.rate_deferred_from IS NOT NULL)
        -- Kept apart from the count below, which then runs only for the keys found here.
        OFFSET 0
    ) AS held
    WHERE (SELECT count(*) FROM ratelimit_delivery AS d
           WHERE d.key = held.key AND d.at > window_start) < p_limit;"""

ARGUMENTS = "text[], uuid[], text[], uuid[], uuid[], boolean[], integer, double precision"
CUSTOM_PLANS = (
    f"ALTER FUNCTION ratelimit_admit_many({ARGUMENTS}) SET plan_cache_mode = force_custom_plan;"
)
SEQSCAN_OFF = f"ALTER FUNCTION ratelimit_admit_many({ARGUMENTS}) SET enable_seqscan = off;"

assert BEFORE.count(RELEASE_BEFORE) == 1
ADMIT_MANY = BEFORE.replace(RELEASE_BEFORE, RELEASE)


class Migration(migrations.Migration):
    dependencies = [("ratelimits", "0009_admission_plans_kept")]

    operations = [
        migrations.RunSQL(ADMIT_MANY + CUSTOM_PLANS, reverse_sql=BEFORE + SEQSCAN_OFF),
    ]
