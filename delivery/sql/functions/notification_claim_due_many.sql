-- The claim: up to p_limit due rows in claim order, locked with SKIP LOCKED, marked PROCESSING
-- under a fresh token, their attempts opened. Claim order: CRITICAL rows first, whoever's; then
-- clients take turns, the one served longest ago first (delivery_client_turn), a client's
-- turns counted from the claims the calling worker already holds for it (p_held_clients,
-- p_held_counts: running or waiting for a send slot), each client's own rows in priority
-- order, a row moving up one level (never above HIGH) for each p_aging_s it has waited past
-- its due time (0: no aging). A function so that its plan is made once per connection; the
-- SET clauses keep that plan to the indexes. The last three parameters have defaults so that
-- a worker of the previous release, still running while the migration lands, claims
-- through it.
-- A row with an expiry answers the seconds left of it by the database clock (<= 0: expired,
-- for the worker's expiry stage to end), and a row that may be cancelled by key says so: both
-- go through the worker's last check before the provider call. A row whose earlier send
-- started and never reported back (its claim expired) answers neither: that send goes on as it
-- would have.
CREATE OR REPLACE FUNCTION notification_claim_due_many(p_limit integer, p_worker text, p_claim_timeout_s double precision, p_aging_s double precision DEFAULT 0, p_held_clients uuid[] DEFAULT NULL::uuid[], p_held_counts integer[] DEFAULT NULL::integer[])
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
    -- pairs:     the (priority, client) pairs with waiting rows, by a loose index scan of
    --            queue_pending_client (one probe per pair, however many rows each has);
    -- due_pairs: those with a due row; a client's CRITICAL pair is its CRITICAL tier, its
    --            other pairs its other tier;
    -- shares:    what one client may take of the claim in its tier: ceil(limit / clients
    --            with a due row in the tier) when the worker holds nothing for them, else
    --            each client topped up to a common level, its held claims counted;
    -- locked:    each pair's due rows, at most its client's share, locked with SKIP LOCKED;
    --            each pair's rows come by due time, so also by the level aging gives them and
    --            the time they reached it;
    -- ranked:    each client's rows in its own order, a merge of its pairs' heads (level, the
    --            time the row reached it, age), numbered within the tier: its turns;
    -- due:       the claim: CRITICAL tier first, then turn by turn, a client's turns counted
    --            from what the worker holds for it already (a client holding every send slot
    --            waits until the others have as many), and within a turn the clients in the
    --            order they were last served.
    -- The cost grows with the number of clients that have waiting rows (and the claims the
    -- worker holds), not with the rows.
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
        -- The pair's earliest row, if due. The pair's due rows are named by equalities on
        -- the priority and the client and a bound on the due time, and taken in
        -- queue_pending_client's whole order, created_at last: no other index can serve
        -- that without a sort, which the function turns off. (Ordered by due time alone, a
        -- plan could take queue_pending_due instead and read the priority's due rows of
        -- every client until one of this client's.) Not a row comparison: PostgreSQL 16
        -- ends a walk at a row comparison's end only where its first column decides, so a
        -- pair with no due row would be walked through all its rows held for later.
        SELECT pr.priority, pr.client_id, pr.priority = 0 AS critical
        FROM pairs AS pr
        CROSS JOIN LATERAL (
            SELECT q.due_at FROM notification_queue AS q
            WHERE q.status = 'PENDING'
              AND q.priority = pr.priority AND q.client_id = pr.client_id
              AND q.due_at <= notifyqueue_now()
            ORDER BY q.priority, q.client_id, q.due_at, q.created_at
            LIMIT 1
        ) AS due_now
    ), shares AS (
        -- Filled up to a common level: the claims the worker holds for a client count toward
        -- it, so a client holding every send slot gets nothing while the others catch up.
        -- With nothing held, ceil(limit / clients in the tier). The client holding least
        -- always has a share, and the shares add up to at most limit + held + clients.
        SELECT t.client_id, t.critical, t.held,
               least(p_limit, greatest(0,
                   ceil((p_limit + sum(t.held) OVER tier)::numeric / count(*) OVER tier)::int
                   - t.held)) AS share
        FROM (
            SELECT c.client_id, c.critical, coalesce(h.held, 0) AS held
            FROM (SELECT DISTINCT dp.client_id, dp.critical FROM due_pairs AS dp) AS c
            LEFT JOIN unnest(p_held_clients, p_held_counts) AS h(client_id, held)
                   ON h.client_id = c.client_id
        ) AS t
        WINDOW tier AS (PARTITION BY t.critical)
    ), locked AS (
        SELECT dp.client_id, dp.critical, head.id, head.priority, head.due_at, head.created_at,
               s.share, s.held
        FROM due_pairs AS dp
        JOIN shares AS s ON s.client_id = dp.client_id AND s.critical = dp.critical
        CROSS JOIN LATERAL (
            -- The record is what is locked (found through the queue row, the snapshot's
            -- copy). A record changed meanwhile is locked in its new version, which the
            -- UPDATE below re-checks: its WHERE names the record's own status and due
            -- time. (Not here: the planner might start from the record.)
            SELECT n.id, q.priority, q.due_at, q.created_at
            FROM notification_queue AS q
            JOIN notification AS n ON n.id = ANY (ARRAY[q.id])
            WHERE q.status = 'PENDING'
              AND q.priority = dp.priority AND q.client_id = dp.client_id
              AND q.due_at <= notifyqueue_now()
            ORDER BY q.priority, q.client_id, q.due_at, q.created_at
            LIMIT s.share
            FOR UPDATE OF n SKIP LOCKED
        ) AS head
    ), ranked AS (
        -- A NORMAL or LOW row that has waited past its due time for `steps` periods stands
        -- `steps` levels higher (never above HIGH), as if it had become due at that level
        -- when it reached it. With aging off (or a non-finite period) no row moves.
        SELECT l.id, l.client_id, l.critical,
               row_number() OVER (
                   PARTITION BY l.client_id, l.critical
                   ORDER BY l.priority - aged.steps,
                            CASE WHEN aged.steps = 0 THEN l.due_at
                                 ELSE l.due_at + make_interval(secs => aged.steps * p_aging_s)
                            END,
                            l.due_at, l.created_at
               ) AS turn,
               l.share, l.held
        FROM locked AS l
        CROSS JOIN LATERAL (
            SELECT CASE
                       WHEN p_aging_s > 0 AND p_aging_s < 'infinity'::float8 AND l.priority > 1
                       THEN least(l.priority - 1,
                                  floor(extract(epoch FROM notifyqueue_now() - l.due_at)::float8
                                        / p_aging_s))::int
                       ELSE 0
                   END AS steps
        ) AS aged
    ), due AS (
        SELECT r.id, r.client_id,
               row_number() OVER (
                   ORDER BY NOT r.critical, r.turn + r.held,
                            t.served_claim NULLS FIRST, t.served_position NULLS FIRST,
                            r.client_id
               ) AS place
        FROM ranked AS r
        LEFT JOIN delivery_client_turn AS t ON t.client_id = r.client_id
        -- A client's rows past its share are left out: its pairs were read only that far,
        -- so its own order is known only that far.
        WHERE r.turn <= r.share
        ORDER BY place
        LIMIT p_limit
    ), served AS (
        -- Each client served goes to the back of the turns, in the order of its last row in
        -- this claim. A client whose marker another claim is writing at this moment is
        -- skipped (that claim moves it back): the claim never waits for another.
        INSERT INTO delivery_client_turn AS t (client_id, served_claim, served_position)
        SELECT d.client_id, (SELECT nextval('delivery_client_turn_claim')), max(d.place)
        FROM due AS d
        WHERE pg_try_advisory_xact_lock(hashtext('notifyqueue:client_turn'),
                                        hashtext(d.client_id::text))
        GROUP BY d.client_id
        ON CONFLICT (client_id) DO UPDATE
            SET served_claim = excluded.served_claim, served_position = excluded.served_position
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
                  n.metadata, n.priority, due.place, n.attempt_count,
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
    -- In claim order, which the worker keeps for the rows that wait for a send slot. An empty
    -- metadata object or fallback list comes back NULL (Claim reads it as empty), so most
    -- claimed rows have no JSON for the worker to decode.
    SELECT c.id, c.claim_token, c.client_id, c.channel, c.recipient, c.subject, c.body,
           nullif(c.metadata, '{}'::jsonb), c.priority, c.attempt_count, c.max_attempts,
           c.user_id, c.template, c.payload, nullif(c.fallback_channels, '[]'::jsonb),
           c.expires_in_s, c.cancellable
    FROM claimed AS c
    ORDER BY c.place;
END $function$;
