-- The claim: up to p_limit due rows in claim order (priority, then clients in turn), locked with
-- SKIP LOCKED, marked PROCESSING under a fresh token, their attempts opened. A function so that
-- its plan is made once per connection; the SET clauses keep that plan to the indexes. A row
-- with an expiry answers the seconds left of it by the database clock (<= 0: expired, for the
-- worker's expiry stage to end), and a row that may be cancelled by key says so: both go through
-- the worker's last check before the provider call. A row whose earlier send started and never
-- reported back (its claim expired) answers neither: that send goes on as it would have.
CREATE OR REPLACE FUNCTION notification_claim_due_many(p_limit integer, p_worker text, p_claim_timeout_s double precision)
 RETURNS TABLE(id uuid, claim_token uuid, client_id uuid, channel notification_channel, recipient character varying, subject text, body text, metadata jsonb, priority notification_priority, attempt_count notification_count, max_attempts notification_count, user_id character varying, template character varying, payload jsonb, fallback_channels jsonb, expires_in_s double precision, cancellable boolean)
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
 SET enable_seqscan TO 'off'
 SET enable_bitmapscan TO 'off'
 SET enable_sort TO 'off'
 SET enable_hashjoin TO 'off'
 SET enable_mergejoin TO 'off'
 SET enable_memoize TO 'off'
 SET enable_incremental_sort TO 'off'
AS $function$
#variable_conflict use_column
BEGIN
    -- Below the threshold a kept plan could be made from figures that cannot tell one
    -- index from another: each call is planned for itself instead.
    IF (SELECT c.reltuples FROM pg_class AS c WHERE c.oid = 'notification'::regclass)
       < 10000 THEN
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
        WHERE n.id = ANY (ARRAY[due.id]) AND n.status = 'PENDING' AND n.due_at <= notifyqueue_now()
        RETURNING n.id, n.claim_token, n.client_id, n.channel, n.recipient, n.subject, n.body,
                  n.metadata, n.priority, n.due_at, n.created_at, n.attempt_count,
                  n.max_attempts, n.user_id, n.template, n.payload, n.fallback_channels,
                  CASE WHEN n.send_started_at IS NULL
                       THEN extract(epoch FROM n.expires_at - notifyqueue_now())::float8
                  END AS expires_in_s,
                  n.cancellation_key IS NOT NULL AND n.send_started_at IS NULL AS cancellable
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
           c.user_id, c.template, c.payload, nullif(c.fallback_channels, '[]'::jsonb),
           c.expires_in_s, c.cancellable
    FROM claimed AS c
    ORDER BY c.priority, c.due_at, c.created_at;
END $function$;
