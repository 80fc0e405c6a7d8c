"""`notification_claim_due_many(...)`: the claim keeps one plan for a server connection again.

Planned on every call, a claim of one row cost PostgreSQL 4.6 million instructions, of which
parsing, analysing and planning were 3.6 million (`bench/pg_instructions.py --statement turn
--batch-size 1`): at a steady trickle, where each claim takes a row or two, that is most of a
worker's turn (docs/performance.md, "Twenty-first round"). PL/pgSQL parses the statement once
and, with `force_generic_plan`, plans it once per connection; nothing lives in the client's
session, so it runs through PgBouncer in transaction mode, as the finish does (delivery 0010).

Migration 0013 kept the claim's plan before and 0014 withdrew it: in three two-worker drains
of thirteen, claims took a quarter of a second each for seconds on end, after a statistics
refresh in the middle of a burst, and the cause was not found then. The twentieth round found
what a claim did with such statistics: it paired the pair's due queue rows with their records
by walking `notification_pkey` from end to end, the whole history, on every claim (planned on
every call, too: it was a merge join then; with merge and hash joins off, a nested loop
driven by that walk is the same read). Both joins to `notification` are now written
`n.id = ANY (ARRAY[x.id])`, which PostgreSQL can only use as a probe of the primary key for
each row on the other side: no plan walks the record's key or its table, whatever the
statistics say.

The rest of what a kept plan could get wrong is pinned as 0013 pinned it: sequential and
bitmap scans, hash and merge joins, memoizing and sorts are off, and each pair's due rows are
named as a range of `queue_pending_client`'s key, (priority, client, -infinity) to (priority,
client, now), taken in that key's order, so that no other index can serve them (with plain
equalities a plan could take `queue_pending_due` and read every client's due rows of the
priority until one of this client's). Incremental sorts are off too: `enable_sort` does not
cover them, and with them a plan made for a burst the statistics had not seen read
`queue_pending_due` for the whole priority (60,202 index entries for a claim of 100, against
402). The sorts left, which every plan has, are over what was claimed.

Empty tables are the one state no setting helps: at 0 rows every index of `notification` that
holds `id` costs what its primary key costs, and a plan kept from them probed
`notification_recipient` whole for every claimed row (52,832 pages for a claim of 100 after a
burst of 20,000, against 2,546). So until the record's statistics count KEPT_FROM_ROWS rows the
function plans each call for itself, from the tables' current sizes, as the statement did.

The rule is the statement's (delivery/sql/queries.sql before this migration): priority
first; within a priority, round robin across clients (each client with a due row takes its
turn, each client's rows by due time), no client taking more than its share of one claim
while others wait; rows other workers hold are skipped; the attempt is counted and its row
inserted at claim time; the claimed rows come back in claim order.
tests/integration/test_delivery_claims.py holds the kept plan to that shape whether it was
made with an empty queue, a full one or statistics from two moments, and a claim of 100 after a
burst its plan never saw to about 2,500 pages, kept plan or planned each call.
"""

from importlib import import_module

from django.db import migrations

_kept_before = import_module("delivery.migrations.0013_claim_function")
ARGUMENTS = _kept_before.ARGUMENTS

# The records the statistics must count before the kept plan is used (see above). At 200
# creates a second an installation passes it within a minute or two; where it takes longer,
# planning each claim costs little in all.
KEPT_FROM_ROWS = 10_000
# The function's first statement: below the threshold, its call is planned for itself (the
# setting is the function's, undone when it returns). The finish starts with it too (0019).
PLANNED_EACH_CALL_WHILE_SMALL = (
    "    -- Below the threshold a kept plan could be made from figures that cannot tell one\n"
    "    -- index from another: each call is planned for itself instead.\n"
    "    IF (SELECT c.reltuples FROM pg_class AS c WHERE c.oid = 'notification'::regclass)\n"
    f"       < {KEPT_FROM_ROWS} THEN\n"
    "        PERFORM set_config('plan_cache_mode', 'force_custom_plan', true);\n"
    "    END IF;\n"
)

# 0013's function with these changes, each made in exactly one place.
CHANGES = [
    # The answer's types are the columns' domains since notifications 0021 (RETURN QUERY must
    # answer exactly its declared types).
    (
        "channel varchar, recipient varchar,\n"
        "    subject text, body text, metadata jsonb, priority smallint, attempt_count integer,\n"
        "    max_attempts integer,",
        "channel notification_channel,\n"
        "    recipient varchar, subject text, body text, metadata jsonb,\n"
        "    priority notification_priority, attempt_count notification_count,\n"
        "    max_attempts notification_count,",
    ),
    ("SET enable_memoize = off\n", "SET enable_memoize = off\nSET enable_incremental_sort = off\n"),
    ("BEGIN\n    RETURN QUERY\n", f"BEGIN\n{PLANNED_EACH_CALL_WHILE_SMALL}    RETURN QUERY\n"),
    (
        "JOIN notification AS n ON n.id = q.id",
        "JOIN notification AS n ON n.id = ANY (ARRAY[q.id])",
    ),
    (
        "WHERE n.id = due.id AND n.status = 'PENDING'",
        "WHERE n.id = ANY (ARRAY[due.id]) AND n.status = 'PENDING'",
    ),
]
FUNCTION = _kept_before.FUNCTION
for before, after in CHANGES:
    assert FUNCTION.count(before) == 1, before
    FUNCTION = FUNCTION.replace(before, after)


class Migration(migrations.Migration):
    dependencies = [
        ("delivery", "0017_finish_plan_generic_from_the_start"),
        ("notifications", "0022_create_checked_answers_chosen_columns"),
    ]

    operations = [
        migrations.RunSQL(
            FUNCTION, reverse_sql=f"DROP FUNCTION notification_claim_due_many({ARGUMENTS});"
        ),
    ]
