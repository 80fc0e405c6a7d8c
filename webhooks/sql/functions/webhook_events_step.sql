-- A webhook sender's step in one statement: the results of its finished POSTs (each claim
-- ended DELIVERED, FAILED, or PENDING again its retry_in_s seconds from now on the database
-- clock, its attempt row finished), then a claim of up to p_limit due events. The claim sees
-- the finish's changes, so the room the results free is claimed in the same step. Answers the
-- finished events (`finished`, with only their id) and the claimed ones.
--
-- A function, so that PostgreSQL plans its statements once per server connection instead of
-- at every step (docs/decisions/0003-kept-plans-in-plpgsql-functions.md), and so that a step
-- is one round trip. Its commit does not wait for the WAL to reach the disk: only a crash of
-- the server in the moment after a step can lose it, and then its events come back as they
-- were before it (PENDING, or DELIVERING until their claim expires) and are POSTed again;
-- webhooks are at least once and receivers deduplicate by eventId
-- (docs/decisions/0019-webhook-claims-ahead.md).
--
-- The finish: every write that ends a claim names the claim token, which an event has exactly
-- while it is DELIVERING (CHECK webhook_event_claim_iff_delivering), so a result that comes
-- after its claim was taken over changes nothing and is not answered. An event is found by its
-- primary key (`= ANY` of the ids: one probe each), and the queue's trigger removes or updates
-- its webhook_queue row.
--
-- The claim, fairly across clients: each client may have at most p_per_client events
-- DELIVERING, all held by one sender (a client whose events another sender holds gets none
-- here, so its POSTs in flight are one sender's per-client cap however many senders run), and
-- the batch takes every client's oldest due event before any client's second (round-robin), so
-- one client's backlog or dead endpoint cannot take the batch from the others. Due-ness and
-- the claim's expiry use the database clock, notifyqueue_now(). Its cost grows with neither
-- the backlog nor the history: it reads webhook_queue, which holds only the events not yet
-- final (its triggers: webhooks/sql/functions/). `clients` walks the distinct clients with
-- PENDING events by skipping through the index webhook_queue_client_due (one index probe per
-- client, however many events each has), and each client then reads at most p_per_client due
-- rows from the same index and counts its DELIVERING rows in webhook_queue_client_busy. The
-- chosen events are locked in webhook_event (SKIP LOCKED, so concurrent senders take disjoint
-- sets, and still PENDING once locked), marked DELIVERING with a fresh token (the queue's
-- trigger copies the change), their attempt counted and its attempt row opened, all committed
-- before any HTTP call. (The skip scan orders by the whole key of webhook_queue_client_due so
-- that the planner reads that partial index, not another one that would also walk each
-- client's claims in flight; incremental sort is off, or the planner may walk
-- webhook_queue_due in due order and filter by client, reading every other client's backlog.)
CREATE OR REPLACE FUNCTION webhook_events_step(p_event_ids uuid[], p_claim_tokens uuid[], p_states text[], p_outcomes text[], p_retry_in_s double precision[], p_status_codes integer[], p_errors text[], p_durations_ms integer[], p_limit integer, p_per_client integer, p_claim_timeout_s double precision, p_worker text)
 RETURNS TABLE(finished boolean, id uuid, claim_token uuid, client_id uuid, notification_id uuid, status text, attempt_count integer, occurred_at timestamp with time zone, delivery_attempts integer, attempt_number bigint, webhook_url text, webhook_secret text, previous_webhook_secret text, previous_webhook_secret_expires_at timestamp with time zone, claimed_at timestamp with time zone, type text, receipt text, message_id text)
 LANGUAGE plpgsql
 SET enable_incremental_sort TO 'off'
 SET enable_seqscan TO 'off'
 SET enable_hashjoin TO 'off'
 SET enable_mergejoin TO 'off'
AS $function$
#variable_conflict use_column
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    IF cardinality(p_event_ids) > 0 THEN
        RETURN QUERY
        WITH result AS (
            SELECT *
            FROM unnest(p_event_ids, p_claim_tokens, p_states,
                        p_outcomes, p_retry_in_s, p_status_codes,
                        p_errors, p_durations_ms)
                AS r(event_id, claim_token, state, outcome, retry_in_s, status_code, error, duration_ms)
        ),
        finished AS (
            UPDATE webhook_event AS e
            SET state = r.state,
                next_attempt_at = CASE WHEN r.retry_in_s IS NULL THEN e.next_attempt_at
                                       ELSE notifyqueue_now() + make_interval(secs => r.retry_in_s)
                                  END,
                claim_token = NULL,
                claim_expires_at = NULL,
                last_error = r.error,
                last_status_code = r.status_code,
                delivered_at = CASE WHEN r.state = 'DELIVERED' THEN notifyqueue_now() END
            FROM result AS r
            WHERE e.id = ANY (p_event_ids)
              AND e.id = r.event_id AND e.claim_token = r.claim_token
            RETURNING e.id, r.claim_token
        ),
        attempt AS (
            UPDATE webhook_delivery_attempt AS a
            SET finished_at = notifyqueue_now(),
                outcome = r.outcome,
                status_code = r.status_code,
                error = r.error,
                duration_ms = r.duration_ms
            FROM result AS r
            WHERE a.claim_token = ANY (p_claim_tokens)
              AND a.claim_token = r.claim_token
              AND r.claim_token IN (SELECT claim_token FROM finished)
        )
        SELECT true, f.id, NULL::uuid, NULL::uuid, NULL::uuid, NULL::text, NULL::integer,
               NULL::timestamptz, NULL::integer, NULL::bigint, NULL::text, NULL::text, NULL::text,
               NULL::timestamptz, NULL::timestamptz, NULL::text, NULL::text, NULL::text
        FROM finished AS f;
    END IF;
    IF p_limit > 0 THEN
        RETURN QUERY
        WITH RECURSIVE clients AS (
            (SELECT client_id FROM webhook_queue WHERE state = 'PENDING'
             ORDER BY client_id, next_attempt_at, created_at LIMIT 1)
            UNION ALL
            SELECT (SELECT q.client_id FROM webhook_queue AS q
                    WHERE q.state = 'PENDING' AND q.client_id > c.client_id
                    ORDER BY q.client_id, q.next_attempt_at, q.created_at LIMIT 1)
            FROM clients AS c
            WHERE c.client_id IS NOT NULL
        ),
        candidates AS (
            SELECT d.id, d.next_attempt_at, busy.room,
                   row_number() OVER (PARTITION BY c.client_id ORDER BY d.next_attempt_at, d.created_at)
                       AS turn
            FROM clients AS c
            CROSS JOIN LATERAL (
                SELECT CASE WHEN bool_or(f.claimed_by IS DISTINCT FROM p_worker) THEN 0
                            ELSE greatest(p_per_client - count(*), 0)
                       END AS room
                FROM webhook_queue AS f
                WHERE f.client_id = c.client_id AND f.state = 'DELIVERING'
            ) AS busy
            -- A constant LIMIT (not `room`), so that the planner knows it reads a few rows of this
            -- client's index rather than filtering the whole queue by due time.
            CROSS JOIN LATERAL (
                SELECT q.id, q.next_attempt_at, q.created_at
                FROM webhook_queue AS q
                WHERE q.client_id = c.client_id AND q.state = 'PENDING'
                  AND q.next_attempt_at <= notifyqueue_now()
                ORDER BY q.next_attempt_at, q.created_at
                LIMIT p_per_client
            ) AS d
            WHERE c.client_id IS NOT NULL
        ),
        due AS (
            SELECT e.id
            FROM (
                SELECT id FROM candidates
                WHERE turn <= room
                ORDER BY turn, next_attempt_at
                LIMIT p_limit
            ) AS chosen
            JOIN webhook_event AS e ON e.id = chosen.id
            WHERE e.state = 'PENDING'
            FOR UPDATE OF e SKIP LOCKED
        ),
        claimed AS (
            UPDATE webhook_event AS e
            SET state = 'DELIVERING',
                claim_token = gen_random_uuid(),
                claim_expires_at = notifyqueue_now() + make_interval(secs => p_claim_timeout_s),
                claimed_by = p_worker,
                delivery_attempts = e.delivery_attempts + 1
            FROM due
            WHERE e.id = due.id
            RETURNING e.id, e.claim_token, e.client_id, e.notification_id, e.status, e.attempt_count,
                      e.occurred_at, e.delivery_attempts, e.type, e.receipt, e.message_id
        ),
        numbered AS (
            SELECT c.*,
                   1 + (SELECT count(*) FROM webhook_delivery_attempt AS a WHERE a.event_id = c.id)
                       AS attempt_number
            FROM claimed AS c
        ),
        opened AS (
            INSERT INTO webhook_delivery_attempt (event_id, claim_token, number, url, started_at)
            SELECT n.id, n.claim_token, n.attempt_number, cl.webhook_url, notifyqueue_now()
            FROM numbered AS n
            JOIN clients_client AS cl ON cl.id = n.client_id
        )
        SELECT false, n.id, n.claim_token, n.client_id, n.notification_id, n.status::text,
               n.attempt_count, n.occurred_at, n.delivery_attempts, n.attempt_number,
               cl.webhook_url::text, cl.webhook_secret::text, cl.previous_webhook_secret::text,
               cl.previous_webhook_secret_expires_at, notifyqueue_now(), n.type::text,
               n.receipt::text, n.message_id
        FROM numbered AS n
        JOIN clients_client AS cl ON cl.id = n.client_id
        ORDER BY n.id;
    END IF;
END $function$;
