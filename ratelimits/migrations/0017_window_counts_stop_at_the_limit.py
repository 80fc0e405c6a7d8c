"""The admission's counts of a key's window stop at the limit.

Every count the admission makes is compared with the limit (`in_window + nth - 1 < p_limit`,
and after the claim `count < p_limit` for a key with a held row), so a count from `p_limit`
up gives the same verdict as the full one. CRITICAL deliveries are never held back, so a
window can hold any number of them; counted in full, a claim of 50 rows for a recipient with
2,000 CRITICAL deliveries in its window read all 2,000 for each row since migration 0016 made
the count per row (100,000 entries of `ratelimit_key_at`), and once per key before it. Each
count now reads at most `p_limit` entries
(tests/integration/test_ratelimits.py::test_a_window_full_of_critical_deliveries_costs_a_claim_no_more_than_its_limit).
"""

from importlib import import_module

from django.db import migrations

_kept = import_module("ratelimits.migrations.0014_admission_plans_kept")
_before = import_module("ratelimits.migrations.0016_admission_count_per_row")

COUNT_BEFORE = """
        CROSS JOIN LATERAL (
            SELECT count(*) AS in_window
            FROM ratelimit_delivery AS d
            WHERE (d.key, d.at) > (cl.key, window_start)
              AND (d.key, d.at) <= (cl.key, 'infinity'::timestamptz)
        ) AS w"""
COUNT = """
        CROSS JOIN LATERAL (
            -- At most p_limit deliveries: any count from there up gives the same verdict.
            SELECT count(*) AS in_window
            FROM (SELECT FROM ratelimit_delivery AS d
                  WHERE (d.key, d.at) > (cl.key, window_start)
                    AND (d.key, d.at) <= (cl.key, 'infinity'::timestamptz)
                  LIMIT p_limit) AS counted
        ) AS w"""

RELEASE_COUNT_BEFORE = """
    WHERE (SELECT count(*) FROM ratelimit_delivery AS d
           WHERE (d.key, d.at) > (held.key, window_start)
             AND (d.key, d.at) <= (held.key, 'infinity'::timestamptz)) < p_limit;"""
RELEASE_COUNT = """
    WHERE (SELECT count(*) FROM (SELECT FROM ratelimit_delivery AS d
                                 WHERE (d.key, d.at) > (held.key, window_start)
                                   AND (d.key, d.at) <= (held.key, 'infinity'::timestamptz)
                                 LIMIT p_limit) AS counted) < p_limit;"""

ADMIT_MANY = _before.ADMIT_MANY
for before, after in ((COUNT_BEFORE, COUNT), (RELEASE_COUNT_BEFORE, RELEASE_COUNT)):
    assert ADMIT_MANY.count(before) == 1, before
    ADMIT_MANY = ADMIT_MANY.replace(before, after)


class Migration(migrations.Migration):
    dependencies = [("ratelimits", "0016_admission_count_per_row")]

    operations = [
        migrations.RunSQL(
            ADMIT_MANY + _kept.SETTINGS, reverse_sql=_before.ADMIT_MANY + _kept.SETTINGS
        ),
    ]
