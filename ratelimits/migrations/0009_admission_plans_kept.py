"""The admission's plans are kept per connection again, without sequential scans.

Migration 0007 had PostgreSQL plan the admission's statements on every call
(`plan_cache_mode = force_custom_plan`): a kept plan made while the window table was small
read it whole, sequentially, for as long as the connection lived. Planning them cost about a
sixth of the admission (5–6 µs of PostgreSQL's CPU per admitted row). With sequential scans
off for the function, a kept plan reaches every table through its index whatever its size
when the plan was made, so the plans are kept again (docs/performance.md, "Seventh round";
tests/integration/test_ratelimits.py checks that a kept plan does not read the window table).
"""

from django.db import migrations

ARGUMENTS = "text[], uuid[], text[], uuid[], uuid[], boolean[], integer, double precision"


class Migration(migrations.Migration):
    dependencies = [("ratelimits", "0008_delivery_notification_unchecked")]

    operations = [
        migrations.RunSQL(
            f"ALTER FUNCTION ratelimit_admit_many({ARGUMENTS}) RESET plan_cache_mode;"
            f"ALTER FUNCTION ratelimit_admit_many({ARGUMENTS}) SET enable_seqscan = off;",
            reverse_sql=(
                f"ALTER FUNCTION ratelimit_admit_many({ARGUMENTS}) RESET enable_seqscan;"
                f"ALTER FUNCTION ratelimit_admit_many({ARGUMENTS}) "
                "SET plan_cache_mode = force_custom_plan;"
            ),
        ),
    ]
