-- The webhook sender's queries. Only webhooks/repositories.py runs them.
-- Every write that ends a claim names the claim token and expects state = 'DELIVERING',
-- so a sender whose claim expired (and was taken over) changes nothing.

-- name: webhook_event_claim_due
-- Claims up to %(limit)s due events in one statement: lock them (skipping any another
-- sender holds), mark them DELIVERING with a fresh token, count the attempt, and open its
-- attempt row. Committed before any HTTP call, so no lock is held while posting.
WITH due AS (
    SELECT id
    FROM webhook_event
    WHERE state = 'PENDING' AND next_attempt_at <= %(now)s
    ORDER BY next_attempt_at, created_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
claimed AS (
    UPDATE webhook_event AS e
    SET state = 'DELIVERING',
        claim_token = gen_random_uuid(),
        claim_expires_at = %(now)s + make_interval(secs => %(claim_timeout_s)s),
        delivery_attempts = e.delivery_attempts + 1
    FROM due
    WHERE e.id = due.id
    RETURNING e.id, e.claim_token, e.client_id, e.notification_id, e.status, e.attempt_count,
              e.occurred_at, e.delivery_attempts
),
numbered AS (
    SELECT c.*,
           1 + (SELECT count(*) FROM webhook_delivery_attempt AS a WHERE a.event_id = c.id)
               AS attempt_number
    FROM claimed AS c
),
opened AS (
    INSERT INTO webhook_delivery_attempt (event_id, claim_token, number, url, started_at)
    SELECT n.id, n.claim_token, n.attempt_number, cl.webhook_url, %(now)s
    FROM numbered AS n
    JOIN clients_client AS cl ON cl.id = n.client_id
)
SELECT n.id, n.claim_token, n.notification_id, n.status, n.attempt_count, n.occurred_at,
       n.delivery_attempts, n.attempt_number, cl.webhook_url, cl.webhook_secret,
       cl.previous_webhook_secret, cl.previous_webhook_secret_expires_at
FROM numbered AS n
JOIN clients_client AS cl ON cl.id = n.client_id
ORDER BY n.id;

-- name: webhook_event_finish
-- Ends one claim: DELIVERED, FAILED, or PENDING again at %(next_attempt_at)s, and finishes
-- the attempt row. Zero rows returned: the claim is no longer ours.
WITH finished AS (
    UPDATE webhook_event
    SET state = %(state)s,
        next_attempt_at = COALESCE(%(next_attempt_at)s, next_attempt_at),
        claim_token = NULL,
        claim_expires_at = NULL,
        last_error = %(error)s,
        last_status_code = %(status_code)s,
        delivered_at = CASE WHEN %(state)s = 'DELIVERED' THEN %(finished_at)s END
    WHERE id = %(event_id)s AND claim_token = %(claim_token)s AND state = 'DELIVERING'
    RETURNING id
),
attempt AS (
    UPDATE webhook_delivery_attempt
    SET finished_at = %(finished_at)s,
        outcome = %(outcome)s,
        status_code = %(status_code)s,
        error = %(error)s,
        duration_ms = %(duration_ms)s
    WHERE claim_token = %(claim_token)s AND EXISTS (SELECT 1 FROM finished)
)
SELECT id FROM finished;

-- name: webhook_event_reclaim_expired
-- Gives back claims whose sender died or stalled past the claim expiry: PENDING and due at
-- once, or FAILED when that was the last attempt (the attempt is counted at claim time, so
-- an event that kills its sender every time still runs out of attempts). The abandoned
-- attempt rows say so.
WITH expired AS (
    SELECT id, claim_token
    FROM webhook_event
    WHERE state = 'DELIVERING' AND claim_expires_at <= %(now)s
    ORDER BY claim_expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
released AS (
    UPDATE webhook_event AS e
    SET state = CASE WHEN e.delivery_attempts >= %(max_attempts)s THEN 'FAILED' ELSE 'PENDING' END,
        next_attempt_at = %(now)s,
        claim_token = NULL,
        claim_expires_at = NULL,
        last_error = 'claim expired before the sender recorded a result'
    FROM expired
    WHERE e.id = expired.id
    RETURNING e.id, e.state
),
abandoned AS (
    UPDATE webhook_delivery_attempt AS a
    SET finished_at = %(now)s,
        outcome = 'ABANDONED',
        error = 'claim expired before the sender recorded a result'
    FROM expired
    WHERE a.claim_token = expired.claim_token
)
SELECT id, state FROM released ORDER BY id;

-- name: webhook_event_redeliver
-- An operator's redelivery: finished events (DELIVERED or FAILED) become due now with a
-- fresh set of attempts. Events still PENDING or DELIVERING are left alone.
UPDATE webhook_event
SET state = 'PENDING',
    delivery_attempts = 0,
    next_attempt_at = %(now)s,
    delivered_at = NULL,
    redeliveries = redeliveries + 1
WHERE id = ANY(%(event_ids)s) AND state IN ('DELIVERED', 'FAILED')
RETURNING id;
