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

from django.db import migrations

ARGUMENTS = "integer, text, double precision"

FUNCTION = """
CREATE FUNCTION notification_claim_due_many(
    p_limit integer, p_worker text, p_claim_timeout_s double precision
) RETURNS TABLE (
    id uuid, claim_token uuid, client_id uuid, channel notification_channel,
    recipient varchar, subject text, body text, metadata jsonb,
    priority notification_priority, attempt_count notification_count,
    max_attempts notification_count, user_id varchar, template varchar, payload jsonb,
    fallback_channels jsonb
)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET enable_memoize = off
SET enable_sort = off
SET enable_incremental_sort = off
AS $$
#variable_conflict use_column
BEGIN
    -- Below KEPT_FROM_ROWS records a kept plan could be made from figures that cannot tell
    -- one index from another: each claim is planned for itself instead.
    IF (SELECT c.reltuples FROM pg_class AS c WHERE c.oid = 'notification'::regclass)
       < KEPT_FROM_ROWS THEN
        PERFORM set_config('plan_cache_mode', 'force_custom_plan', true);
    END IF;
    RETURN QUERY
    -- pairs: the (priority, client) pairs with waiting rows, by a loose index scan of
    --        queue_pending_client (one probe per pair, however many rows each has);
    -- due_pairs: the pairs with a due row, each with its share of the claim:
    --        ceil(limit / number of clients with a due row at that priority);
    -- due:   each pair's due rows, at most its share, locked with SKIP LOCKED; then taken in
    --        turns across the pairs (every client's first, then every client's second...).
    -- The cost grows with the number of clients that have waiting rows, not with the rows.
    WITH RECURSIVE pairs AS (
        (SELECT q.priority, q.client_id FROM notification_queue AS q
         WHERE q.status = 'PENDING'
         ORDER BY q.priority, q.client_id
         LIMIT 1)
        UNION ALL
        SELECT following.priority, following.client_id
        FROM pairs AS pr
        CROSS JOIN LATERAL (
            SELECT q.priority, q.client_id FROM notification_queue AS q
            WHERE q.status = 'PENDING' AND (q.priority, q.client_id) > (pr.priority, pr.client_id)
            ORDER BY q.priority, q.client_id
            LIMIT 1
        ) AS following
    ), due_pairs AS (
        SELECT pr.priority, pr.client_id,
               ceil(p_limit::numeric / count(*) OVER (PARTITION BY pr.priority))::int AS share
        FROM pairs AS pr
        CROSS JOIN LATERAL (
            SELECT q.due_at FROM notification_queue AS q
            WHERE q.status = 'PENDING'
              AND (q.priority, q.client_id, q.due_at)
                  BETWEEN (pr.priority, pr.client_id, '-infinity'::timestamptz)
                      AND (pr.priority, pr.client_id, notifyqueue_now())
            ORDER BY q.priority, q.client_id, q.due_at
            LIMIT 1
        ) AS due_now
    ), due AS (
        SELECT head.id
        FROM due_pairs AS dp
        CROSS JOIN LATERAL (
            SELECT locked.id, locked.due_at, locked.created_at,
                   row_number() OVER (ORDER BY locked.due_at, locked.created_at) AS turn
            FROM (
                -- The record is what is locked (found through the queue row, the snapshot's
                -- copy). A record changed meanwhile is locked in its new version, which the
                -- UPDATE below re-checks: its WHERE names the record's own status and due
                -- time. (Not here: the planner might start from the record.)
                SELECT n.id, q.due_at, q.created_at
                FROM notification_queue AS q
                JOIN notification AS n ON n.id = ANY (ARRAY[q.id])
                WHERE q.status = 'PENDING'
                  AND (q.priority, q.client_id, q.due_at)
                      BETWEEN (dp.priority, dp.client_id, '-infinity'::timestamptz)
                          AND (dp.priority, dp.client_id, notifyqueue_now())
                ORDER BY q.priority, q.client_id, q.due_at, q.created_at
                LIMIT dp.share
                FOR UPDATE OF n SKIP LOCKED
            ) AS locked
        ) AS head
        ORDER BY dp.priority, head.turn, head.due_at, head.created_at
        LIMIT p_limit
    ), claimed AS (
        UPDATE notification AS n
        SET status = 'PROCESSING',
            claim_token = gen_random_uuid(),
            claimed_by = p_worker,
            claim_expires_at = notifyqueue_now() + make_interval(secs => p_claim_timeout_s),
            attempt_count = n.attempt_count + 1,
            rate_deferred_from = NULL,
            updated_at = notifyqueue_now()
        FROM due
        WHERE n.id = ANY (ARRAY[due.id]) AND n.status = 'PENDING'
          AND n.due_at <= notifyqueue_now()
        RETURNING n.id, n.claim_token, n.client_id, n.channel, n.recipient, n.subject, n.body,
                  n.metadata, n.priority, n.due_at, n.created_at, n.attempt_count,
                  n.max_attempts, n.user_id, n.template, n.payload, n.fallback_channels
    ), attempt AS (
        INSERT INTO delivery_attempt (notification_id, claim_token, number, channel, worker,
                                      started_at)
        SELECT c.id, c.claim_token, c.attempt_count, c.channel, p_worker, notifyqueue_now()
        FROM claimed AS c
    )
    -- An empty metadata object or fallback list comes back NULL (Claim reads it as empty), so
    -- most claimed rows have no JSON for the worker to decode.
    SELECT c.id, c.claim_token, c.client_id, c.channel, c.recipient, c.subject, c.body,
           nullif(c.metadata, '{}'::jsonb), c.priority, c.attempt_count, c.max_attempts,
           c.user_id, c.template, c.payload, nullif(c.fallback_channels, '[]'::jsonb)
    FROM claimed AS c
    ORDER BY c.priority, c.due_at, c.created_at;
END $$;
"""


# The records the statistics must count before the kept plan is used (see above). At 200
# creates a second an installation passes it within a minute or two; where it takes longer,
# planning each claim costs little in all.
KEPT_FROM_ROWS = 10_000
FUNCTION = FUNCTION.replace("KEPT_FROM_ROWS", str(KEPT_FROM_ROWS))


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
