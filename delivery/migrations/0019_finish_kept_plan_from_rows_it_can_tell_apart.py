"""`notification_finish_many(...)`: the finish's kept plan finds each row it finishes by its key,
whatever the statistics said when the plan was made.

The finish keeps one plan per server connection (0010, 0017), made on the connection's first
finish. Made while `notification` held a few dozen rows and then used after a burst of 20,000
not yet analyzed, it read the whole table for the one row a finish changed (20,124 pages
visited for a claim and finish of one row), the walk 0018 took away from the claim: the update
joined its results to the record with `n.id = r.id`, which a plan may serve by walking an index
in order. Written `n.id = ANY (ARRAY[r.id])`, the record can only be probed, row by row; but
at a few rows every index of `notification` that holds `id` costs what the primary key costs,
and the probe went through `notification_recipient` (last column `id`) whole instead (264
of its pages for one row, with 20,000 rows). So the finish starts with the claim's threshold (0018): until the
record's statistics count `KEPT_FROM_ROWS` rows, each finish is planned for itself, from the
tables' current sizes. Hash and merge joins are off as well: the finish's other joins are
each result's attempt and rate-limit slot by their claim token, which a plan could otherwise
pair by walking those tables' token keys whole.

tests/integration/test_delivery_claims.py holds a worker's turn of one row after such a burst
(create, claim, admission, finish) to about a hundred pages of the whole schema, kept plan or
planned each call.
"""

from importlib import import_module

from django.db import migrations

_before = import_module("delivery.migrations.0017_finish_plan_generic_from_the_start")
_claim = import_module("delivery.migrations.0018_claim_kept_plan_again")

# 0017's function with these changes, each made in exactly one place.
CHANGES = [
    (
        "SET enable_seqscan = off\n",
        "SET enable_seqscan = off\nSET enable_hashjoin = off\nSET enable_mergejoin = off\n",
    ),
    (
        "BEGIN\n    RETURN QUERY\n",
        f"BEGIN\n{_claim.PLANNED_EACH_CALL_WHILE_SMALL}    RETURN QUERY\n",
    ),
    ("WHERE n.id = r.id AND", "WHERE n.id = ANY (ARRAY[r.id]) AND"),
]
FINISH = _before.FINISH
for before, after in CHANGES:
    assert FINISH.count(before) == 1, before
    FINISH = FINISH.replace(before, after)


class Migration(migrations.Migration):
    dependencies = [("delivery", "0018_claim_kept_plan_again")]

    operations = [
        migrations.RunSQL(
            FINISH + _before.GENERIC, reverse_sql=_before.FINISH + _before.GENERIC
        ),
    ]
