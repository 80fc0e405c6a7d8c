"""The admission's plans are kept again, with the choice that once went wrong taken away.

`ratelimit_admit_many` has been planned on every call since migration 0010: with its plans
kept (0009), a plan made from the statistics of one moment counted a key's window through
`ratelimit_at` (every delivery of the window, filtered by key) instead of `ratelimit_key_at`.
Planning its statements cost more than running them for the claim of a row or two that a
steady stream of creates makes: 0.6-0.7 ms against 0.16-0.2 ms kept, measured inside
PostgreSQL (docs/performance.md, "Thirteenth round").

Now each step that reads the window names a key's deliveries as a range of
`ratelimit_key_at`'s key, `(key, at)` from `(k, window start)` to `(k, infinity)` (the
forgetting: `(k, -infinity)` to `(k, window start)`), which `ratelimit_at` cannot serve; with
sequential and bitmap scans, hash and merge joins and memoizing off, the plan left is one
probe of `ratelimit_key_at` per key, whatever the statistics when it was made
(tests/integration/test_ratelimits.py). The rule does not change.
"""

from importlib import import_module

from django.db import migrations

_before = import_module("ratelimits.migrations.0012_recipient_digest")

ARGUMENTS = "text[], uuid[], text[], uuid[], uuid[], boolean[], integer, double precision"

FORGET_BEFORE = """
    DELETE FROM ratelimit_delivery AS d
    WHERE d.key = ANY (keys) AND d.at <= window_start;"""
FORGET = """
    DELETE FROM ratelimit_delivery AS d
    USING (SELECT DISTINCT k.key FROM unnest(keys) AS k(key)) AS k
    WHERE (d.key, d.at) BETWEEN (k.key, '-infinity'::timestamptz) AND (k.key, window_start);"""

COUNT_BEFORE = """
            WHERE d.key = k.key AND d.at > window_start
        ) AS w"""
COUNT = """
            WHERE (d.key, d.at) > (k.key, window_start)
              AND (d.key, d.at) <= (k.key, 'infinity'::timestamptz)
        ) AS w"""

RELEASE_COUNT_BEFORE = """
           WHERE d.key = held.key AND d.at > window_start) < p_limit;"""
RELEASE_COUNT = """
           WHERE (d.key, d.at) > (held.key, window_start)
             AND (d.key, d.at) <= (held.key, 'infinity'::timestamptz)) < p_limit;"""

ADMIT_MANY = _before.ADMIT_MANY
for before, after in (
    (FORGET_BEFORE, FORGET),
    (COUNT_BEFORE, COUNT),
    (RELEASE_COUNT_BEFORE, RELEASE_COUNT),
):
    assert ADMIT_MANY.count(before) == 1, before
    ADMIT_MANY = ADMIT_MANY.replace(before, after)

# Re-creating a function resets its settings.
SETTINGS = "".join(
    f"ALTER FUNCTION ratelimit_admit_many({ARGUMENTS}) SET {setting};"
    for setting in (
        "plan_cache_mode = force_generic_plan",
        "enable_seqscan = off",
        "enable_bitmapscan = off",
        "enable_hashjoin = off",
        "enable_mergejoin = off",
        "enable_memoize = off",
    )
)


class Migration(migrations.Migration):
    dependencies = [("ratelimits", "0013_claim_token_primary_key")]

    operations = [
        migrations.RunSQL(
            ADMIT_MANY + SETTINGS, reverse_sql=_before.ADMIT_MANY + _before.SETTINGS
        ),
    ]
