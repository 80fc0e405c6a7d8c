-- The webhook sender's queries. Only webhooks/repositories.py runs them.
-- Every write that ends a claim names the claim token, which an event has exactly while it is
-- DELIVERING (CHECK webhook_event_claim_iff_delivering), so a sender whose claim expired (and
-- was taken over) changes nothing. The claim and the finish are one function,
-- webhooks/sql/functions/webhook_events_step.sql.

-- name: webhook_events_step
-- A sender's step (webhooks/sql/functions/webhook_events_step.sql): the results of its
-- finished POSTs, then a claim of up to %(limit)s due events, at most %(per_client)s
-- DELIVERING per client and none of a client another sender holds, in one statement. Rows
-- with `finished` are the events whose result was recorded (only their id is set); the
-- others are the claimed events.
SELECT finished, id, claim_token, client_id, notification_id, status, attempt_count,
       occurred_at, delivery_attempts, attempt_number, webhook_url, webhook_secret,
       previous_webhook_secret, previous_webhook_secret_expires_at, claimed_at, type, receipt,
       message_id
FROM webhook_events_step(%(event_ids)s::uuid[], %(claim_tokens)s::uuid[], %(states)s::text[],
                         %(outcomes)s::text[], %(retry_in_s)s::float8[],
                         %(status_codes)s::int[], %(errors)s::text[],
                         %(durations_ms)s::int[], %(limit)s, %(per_client)s,
                         %(claim_timeout_s)s, %(worker)s);

-- name: webhook_events_release
-- Gives back claims whose POST never started (a sender stopping with events still waiting
-- for a slot): PENDING again and due as they were, the attempt the claim counted taken back
-- and its attempt row, never used, removed. Guarded by the claim token, like the finish;
-- returns the events released.
WITH released AS (
    UPDATE webhook_event AS e
    SET state = 'PENDING',
        claim_token = NULL,
        claim_expires_at = NULL,
        delivery_attempts = e.delivery_attempts - 1
    FROM unnest(%(event_ids)s::uuid[], %(claim_tokens)s::uuid[]) AS r(event_id, claim_token)
    WHERE e.id = ANY (%(event_ids)s::uuid[])
      AND e.id = r.event_id AND e.claim_token = r.claim_token
    RETURNING e.id, r.claim_token
),
unused AS (
    DELETE FROM webhook_delivery_attempt AS a
    USING released AS r
    WHERE a.claim_token = ANY (%(claim_tokens)s::uuid[]) AND a.claim_token = r.claim_token
)
SELECT id FROM released;

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
