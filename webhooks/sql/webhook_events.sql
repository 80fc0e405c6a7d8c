-- The webhook sender's queries. Only webhooks/repositories.py runs them.
-- Every write that ends a claim names the claim token, which an event has exactly while it is
-- DELIVERING (CHECK webhook_event_claim_iff_delivering), so a sender whose claim expired (and
-- was taken over) changes nothing.

-- name: webhook_event_claim_plan
-- Run in the claim's transaction just before webhook_event_claim_due. Otherwise the planner may
-- walk webhook_queue_due in due order and filter by client, an incremental sort that reads the
-- whole backlog of the other clients; without it, each client's events come straight from
-- webhook_queue_client_due.
SET LOCAL enable_incremental_sort = off;

-- name: webhook_event_claim_due
-- Claims up to %(limit)s due events in one statement, fairly across clients: each client may
-- have at most %(per_client)s events DELIVERING (counted over every sender), and the batch
-- takes every client's oldest due event before any client's second (round-robin), so one
-- client's backlog or dead endpoint cannot take the batch from the others. Due-ness and the
-- claim's expiry use the database clock, notifyqueue_now().
--
-- Cost grows with neither the backlog nor the history: it reads webhook_queue, which holds only
-- the events not yet final (its triggers: webhooks/sql/functions/). `clients` walks the distinct clients with PENDING
-- events by skipping through the index webhook_queue_client_due (one index probe per client,
-- however many events each has), and each client then reads at most %(per_client)s due rows
-- from the same index and counts its DELIVERING rows in webhook_queue_client_busy. The chosen
-- events are locked in webhook_event (SKIP LOCKED, so concurrent senders take disjoint sets,
-- and still PENDING once locked), marked DELIVERING with a fresh token (the queue's trigger
-- copies the change), their attempt counted and its attempt row opened, all committed before
-- any HTTP call.
-- (The skip scan orders by the whole key of webhook_queue_client_due so that the planner reads
-- that partial index, not another one that would also walk each client's claims in flight.)
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
        SELECT greatest(%(per_client)s - count(*), 0) AS room
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
        LIMIT %(per_client)s
    ) AS d
    WHERE c.client_id IS NOT NULL
),
due AS (
    SELECT e.id
    FROM (
        SELECT id FROM candidates
        WHERE turn <= room
        ORDER BY turn, next_attempt_at
        LIMIT %(limit)s
    ) AS chosen
    JOIN webhook_event AS e ON e.id = chosen.id
    WHERE e.state = 'PENDING'
    FOR UPDATE OF e SKIP LOCKED
),
claimed AS (
    UPDATE webhook_event AS e
    SET state = 'DELIVERING',
        claim_token = gen_random_uuid(),
        claim_expires_at = notifyqueue_now() + make_interval(secs => %(claim_timeout_s)s),
        claimed_by = %(worker)s,
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
SELECT n.id, n.claim_token, n.notification_id, n.status, n.attempt_count, n.occurred_at,
       n.delivery_attempts, n.attempt_number, cl.webhook_url, cl.webhook_secret,
       cl.previous_webhook_secret, cl.previous_webhook_secret_expires_at,
       notifyqueue_now() AS claimed_at, n.type, n.receipt, n.message_id
FROM numbered AS n
JOIN clients_client AS cl ON cl.id = n.client_id
ORDER BY n.id;

-- name: webhook_events_finish
-- Ends the claims of a sender's finished POSTs, in one statement: each event DELIVERED, FAILED,
-- or PENDING again its retry_in_s seconds from now on the database clock, and each attempt row
-- finished. Returns the events whose claim was still theirs; any other was taken over, and its
-- late result changes nothing. An event is found by its primary key (`= ANY` of the ids: one
-- probe each, whatever the planner thinks of the arrays), its token names the claim (set only
-- while DELIVERING), and the queue's trigger removes or updates its webhook_queue row. A
-- condition on the state as well matched the in-flight events' partial indexes when they
-- were on webhook_event, which the planner read instead: every finish read every event in
-- flight.
WITH result AS (
    SELECT *
    FROM unnest(%(event_ids)s::uuid[], %(claim_tokens)s::uuid[], %(states)s::text[],
                %(outcomes)s::text[], %(retry_in_s)s::float8[], %(status_codes)s::int[],
                %(errors)s::text[], %(durations_ms)s::int[])
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
    WHERE e.id = ANY (%(event_ids)s::uuid[])
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
    WHERE a.claim_token = ANY (%(claim_tokens)s::uuid[])
      AND a.claim_token = r.claim_token
      AND r.claim_token IN (SELECT claim_token FROM finished)
)
SELECT id FROM finished;

-- name: webhook_event_reclaim_expired
-- Gives back claims their sender can no longer finish: PENDING and due at once, or FAILED when
-- that was the last attempt (the attempt is counted at claim time, so an event that kills its
-- sender every time still runs out of attempts). The abandoned attempt rows say so. Each event
-- says why (`cause`):
-- - dead_worker: the worker whose sender holds it is dead (worker_dead, the delivery app's one
--   definition: stopped, or no heartbeat for %(dead_after_s)s seconds by the database's clock;
--   NULL skips this test). `holders` walks the distinct workers holding events by skipping
--   through webhook_queue_claimed_by (one probe a worker), and only a dead one's events are
--   read: the cost grows with the workers holding claims, not with the backlog.
-- - claim_timeout: the claim is past its expiry (webhook_queue_claim_expiry), whoever holds it.
-- The events are locked in webhook_event, where the claim is checked again once locked: a claim
-- its sender finished meanwhile is gone.
WITH RECURSIVE holders AS (
    (SELECT q.claimed_by FROM webhook_queue AS q
     WHERE q.state = 'DELIVERING' AND q.claimed_by IS NOT NULL
       AND %(dead_after_s)s::float8 IS NOT NULL
     ORDER BY q.claimed_by
     LIMIT 1)
    UNION ALL
    SELECT (SELECT q.claimed_by FROM webhook_queue AS q
            WHERE q.state = 'DELIVERING' AND q.claimed_by > h.claimed_by
            ORDER BY q.claimed_by
            LIMIT 1)
    FROM holders AS h
    WHERE h.claimed_by IS NOT NULL
),
dead_claims AS (
    SELECT q.id, 'dead_worker' AS cause
    FROM holders AS h
    CROSS JOIN LATERAL (
        SELECT q.id FROM webhook_queue AS q
        WHERE q.state = 'DELIVERING' AND q.claimed_by = h.claimed_by
        LIMIT %(limit)s
    ) AS q
    WHERE h.claimed_by IS NOT NULL AND worker_dead(h.claimed_by, %(dead_after_s)s::float8)
    LIMIT %(limit)s
),
timed_out AS (
    SELECT id, 'claim_timeout' AS cause FROM webhook_queue
    WHERE state = 'DELIVERING' AND claim_expires_at <= notifyqueue_now()
    ORDER BY claim_expires_at
    LIMIT %(limit)s
),
found AS (
    -- A dead worker's claim that also timed out counts as the worker's death.
    SELECT DISTINCT ON (c.id) c.id, c.cause
    FROM (SELECT * FROM dead_claims UNION ALL SELECT * FROM timed_out) AS c
    ORDER BY c.id, c.cause = 'dead_worker' DESC
),
expired AS (
    SELECT e.id, e.claim_token, f.cause
    FROM found AS f
    JOIN webhook_event AS e ON e.id = f.id
    WHERE e.state = 'DELIVERING'
      AND (f.cause = 'dead_worker' OR e.claim_expires_at <= notifyqueue_now())
    LIMIT %(limit)s
    FOR UPDATE OF e SKIP LOCKED
),
released AS (
    UPDATE webhook_event AS e
    SET state = CASE WHEN e.delivery_attempts >= %(max_attempts)s THEN 'FAILED' ELSE 'PENDING' END,
        next_attempt_at = notifyqueue_now(),
        claim_token = NULL,
        claim_expires_at = NULL,
        last_error = CASE expired.cause
            WHEN 'dead_worker' THEN 'claim taken over: the worker holding it is dead'
            ELSE 'claim expired before the sender recorded a result'
        END
    FROM expired
    WHERE e.id = expired.id AND e.claim_token = expired.claim_token
    RETURNING e.id, e.state, expired.claim_token, expired.cause
),
abandoned AS (
    UPDATE webhook_delivery_attempt AS a
    SET finished_at = notifyqueue_now(),
        outcome = 'ABANDONED',
        error = CASE r.cause
            WHEN 'dead_worker' THEN 'claim taken over: the worker holding it is dead'
            ELSE 'claim expired before the sender recorded a result'
        END
    FROM released AS r
    WHERE a.claim_token = r.claim_token
)
SELECT id, state, cause FROM released ORDER BY id;

-- name: webhook_event_redeliver
-- An operator's redelivery: finished events (DELIVERED or FAILED) become due now with a
-- fresh set of attempts. Events still PENDING or DELIVERING are left alone.
UPDATE webhook_event
SET state = 'PENDING',
    delivery_attempts = 0,
    next_attempt_at = notifyqueue_now(),
    delivered_at = NULL,
    redeliveries = redeliveries + 1
WHERE id = ANY(%(event_ids)s) AND state IN ('DELIVERED', 'FAILED')
RETURNING id;

-- name: webhook_receipt_events_add
-- A provider's receipts as webhook events, in the transaction that applies them (the
-- outbox), for the clients that have a webhook URL; delivered as any other event.
INSERT INTO webhook_event (id, client_id, notification_id, status, attempt_count, occurred_at,
                           state, delivery_attempts, next_attempt_at, created_at, type,
                           receipt, message_id)
SELECT gen_random_uuid(), e.client_id, e.notification_id, e.status, e.attempt_count,
       e.occurred_at, 'PENDING', 0, notifyqueue_now(), notifyqueue_now(),
       'receipt.' || e.receipt, e.receipt, e.message_id
FROM unnest(%(client_ids)s::uuid[], %(notification_ids)s::uuid[], %(statuses)s::text[],
            %(attempt_counts)s::integer[], %(occurred_ats)s::timestamptz[],
            %(receipts)s::text[], %(message_ids)s::text[])
     AS e(client_id, notification_id, status, attempt_count, occurred_at, receipt, message_id)
JOIN clients_client AS c ON c.id = e.client_id
WHERE c.webhook_url <> ''
RETURNING id;
