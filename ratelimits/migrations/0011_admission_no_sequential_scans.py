"""Sequential scans off in the admission, which is still planned on every call.

Planned on every call (migration 0010), the admission's count of a key's window still read the
whole window table once per key in one run of the full test suite (1,000,400 rows for a claim
of 50 in
`tests/integration/test_ratelimits.py::test_a_claims_admission_counts_each_key_without_reading_the_whole_window`,
from a fresh clone): the table's statistics, left by earlier runs, made a sequential scan look
cheapest for a table that had since grown. Every table the admission reads has the index its
steps need (`ratelimit_key_at` for a key's window, the partial hash index of held rows), so
sequential scans are off for the function: fresh plans from stale statistics still go through
an index.
"""

from django.db import migrations

ARGUMENTS = "text[], uuid[], text[], uuid[], uuid[], boolean[], integer, double precision"


class Migration(migrations.Migration):
    dependencies = [("ratelimits", "0010_release_probe_first")]

    operations = [
        migrations.RunSQL(
            f"ALTER FUNCTION ratelimit_admit_many({ARGUMENTS}) SET enable_seqscan = off;",
            reverse_sql=f"ALTER FUNCTION ratelimit_admit_many({ARGUMENTS}) RESET enable_seqscan;",
        ),
    ]
