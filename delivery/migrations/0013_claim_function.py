"""`notification_claim_due_many(...)`: the claim as a PL/pgSQL function with a kept plan.

Planned on every call, the claim cost PostgreSQL 0.7-0.9 ms of planning against 0.6 ms of
running when it took two rows (`EXPLAIN (ANALYZE, SUMMARY)`): at a steady 200 creates a second
the worker claims a row or two at a time, and the planning was the largest piece of its turn
(docs/performance.md, "Thirteenth round"). PL/pgSQL keeps the plan for the life of the server
connection; nothing lives in the client's session, so it runs through PgBouncer in transaction
mode, as the finish does (delivery 0010).

A kept plan is made once, from the statistics of that moment, and earlier rounds found the
claim's generic plan made from an empty queue reading and sorting each client's whole due
backlog (45 ms a claim in a burst). So the function plans with sequential scans, bitmap scans,
sorts, hash and merge joins and memoizing off, and every step orders its rows as `queue_pending_client`
(priority, client, due time, creation) holds them: the only plan left without a disabled step
walks that index and finds each claimed record by its primary key (a plan made from a full
queue's statistics otherwise hashed the whole notification table to update a few rows)
(tests/integration/test_delivery_claims.py: the kept plan is the same on an empty queue and
on a full one, and a claim planned on an empty queue reads only what it claims after a burst
of 20,000 rows without ANALYZE). The sorts left (the claim's order across clients, its few
rows) are over what was claimed.

The rule is the statement's as it was (delivery/sql/queries.sql before this migration):
priority first; within a priority, round robin across clients (each client with a due row
takes its turn, each client's rows by due time), no client taking more than its share of one
claim while others wait; rows other workers hold are skipped; the attempt is counted and its
row inserted at claim time; the claimed rows come back in claim order.
"""

from django.db import migrations

ARGUMENTS = "integer, text, double precision"

FUNCTION = """
CREATE FUNCTION notification_claim_due_many(
    p_limit integer, p_worker text, p_claim_timeout_s double precision
) RETURNS TABLE (
    id uuid, claim_token uuid, client_id uuid, channel varchar, recipient varchar,
    subject text, body text, metadata jsonb, priority smallint, attempt_count integer,
    max_attempts integer, user_id varchar, template varchar, payload jsonb,
    fallback_channels jsonb
)
LANGUAGE plpgsql VOLATILE
-- One plan for the life of the connection, whatever the statistics said when it was made:
-- the only plan without a disabled step is the walk of queue_pending_client, each claimed
-- row then found by its primary key (see above).
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET enable_memoize = off
AS $$
#variable_conflict use_column
BEGIN
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
        -- The pair's earliest row, if due. The pair's due rows are named as a range of
        -- queue_pending_client's key, (priority, client, -infinity) to (priority, client,
        -- now), and taken in its order: no other index can serve that. (With plain equalities
        -- a plan could take queue_pending_due instead and read the priority's due rows of
        -- every client until one of this client's.)
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
                JOIN notification AS n ON n.id = q.id
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
        WHERE n.id = due.id AND n.status = 'PENDING' AND n.due_at <= notifyqueue_now()
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


class Migration(migrations.Migration):
    dependencies = [
        ("delivery", "0012_inbox_client_index_dropped"),
        ("notifications", "0015_cancelled_rows_not_held"),
    ]

    operations = [
        migrations.RunSQL(
            FUNCTION, reverse_sql=f"DROP FUNCTION notification_claim_due_many({ARGUMENTS});"
        ),
    ]
