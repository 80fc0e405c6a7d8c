"""The admission counts each row's window in its own probe, instead of joining the claim's rows
to a list of its keys' counts.

`ratelimit_admit_many` counted each distinct key's window (`counted`), then joined the claim's
rows to those counts by key. Hash and merge joins are off for the function (migration 0014:
they are how its kept plan once went wrong), so that join was a nested loop: every row of the
claim compared with every key of it, 62,500 comparisons for a claim of 250 rows to 250
recipients. It was most of the admission's work: PostgreSQL spent 250,000 instructions a row
on the admission of such a claim, more than on its claim or its finish
(`bench/pg_instructions.py --statement turn`; docs/performance.md, "Twentieth round").

Now each row's count is a probe of `ratelimit_key_at` for its own key, with the same range as
before. All of a statement's probes see one snapshot, so the rows of one key see the same
count, and a row's verdict is the one it had: the window's deliveries plus the key's rows
before it in the claim, under the limit. A claim's rows are mostly of distinct keys, so it
probes as often as before; a key with k rows in one claim is probed k times, each probe
bounded by that key's window.
"""

from importlib import import_module

from django.db import migrations

_before = import_module("ratelimits.migrations.0014_admission_plans_kept")

ARGUMENTS = _before.ARGUMENTS

COUNTED_BEFORE = """
    ), counted AS (
        -- One probe of ratelimit_key_at per key of the claim, never the whole window table.
        SELECT k.key, w.in_window
        FROM (SELECT DISTINCT key FROM claimed) AS k
        CROSS JOIN LATERAL (
            SELECT count(*) AS in_window
            FROM ratelimit_delivery AS d
            WHERE (d.key, d.at) > (k.key, window_start)
              AND (d.key, d.at) <= (k.key, 'infinity'::timestamptz)
        ) AS w
    ), decided AS (
        -- The rows before this one in the claim were admitted unless the window was already
        -- full before them, in which case it is full for this one too: so this row sees
        -- in_window + (nth - 1) deliveries.
        SELECT cl.id, cl.claim_token, cl.key,
               cl.critical OR coalesce(co.in_window, 0) + cl.nth - 1 < p_limit AS admitted
        FROM claimed AS cl
        LEFT JOIN counted AS co ON co.key = cl.key
    ), recorded AS ("""
COUNTED = """
    ), decided AS (
        -- The rows before this one in the claim were admitted unless the window was already
        -- full before them, in which case it is full for this one too: so this row sees
        -- in_window + (nth - 1) deliveries. One probe of ratelimit_key_at per row, never the
        -- whole window table, and no join between the claim's rows (with hash joins off, a
        -- join of the rows to their keys' counts compared every row with every key).
        SELECT cl.id, cl.claim_token, cl.key,
               cl.critical OR w.in_window + cl.nth - 1 < p_limit AS admitted
        FROM claimed AS cl
        CROSS JOIN LATERAL (
            SELECT count(*) AS in_window
            FROM ratelimit_delivery AS d
            WHERE (d.key, d.at) > (cl.key, window_start)
              AND (d.key, d.at) <= (cl.key, 'infinity'::timestamptz)
        ) AS w
    ), recorded AS ("""

assert _before.ADMIT_MANY.count(COUNTED_BEFORE) == 1
ADMIT_MANY = _before.ADMIT_MANY.replace(COUNTED_BEFORE, COUNTED)


class Migration(migrations.Migration):
    dependencies = [("ratelimits", "0015_window_not_truncated_by_vacuum")]

    operations = [
        migrations.RunSQL(
            ADMIT_MANY + _before.SETTINGS, reverse_sql=_before.ADMIT_MANY + _before.SETTINGS
        ),
    ]
