-- The delivery worker's SQL. `DeliveryRepository` is the only user of these statements.
-- Every statement that ends a claim names the claim token and expects status PROCESSING, so a
-- worker whose claim was taken over changes nothing.

-- name: notification_claim_due
-- Takes up to %(limit)s due rows in claim order, skipping rows other workers hold, and marks
-- them PROCESSING under a fresh claim token. The attempt is counted here, at claim time, so a
-- message that crashes its worker still runs out of attempts. Commits before any provider call.
-- The scan runs once per priority, highest first (the VALUES order drives the nested loop),
-- each a range scan of the claim index that stops at the first row not yet due: rows
-- scheduled far ahead at a high priority are never walked over. The outer LIMIT stops
-- pulling (and locking) once the batch is full, so lower priorities are read only when the
-- higher ones run short.
WITH due AS (
    SELECT head.id
    FROM (VALUES (0), (1), (2), (3)) AS p(priority)
    CROSS JOIN LATERAL (
        SELECT id
        FROM notification
        WHERE status = 'PENDING' AND priority = p.priority AND due_at <= %(now)s
        ORDER BY due_at, created_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS head
    LIMIT %(limit)s
), claimed AS (
    UPDATE notification AS n
    SET status = 'PROCESSING',
        claim_token = gen_random_uuid(),
        claimed_by = %(worker)s,
        claim_expires_at = %(now)s + make_interval(secs => %(claim_timeout_s)s),
        attempt_count = n.attempt_count + 1,
        updated_at = %(now)s
    FROM due
    WHERE n.id = due.id
    RETURNING n.id, n.claim_token, n.client_id, n.channel, n.recipient, n.subject, n.body,
              n.metadata, n.priority, n.due_at, n.created_at, n.attempt_count, n.max_attempts,
              n.user_id, n.template, n.payload, n.fallback_channels, n.claim_expires_at
), attempt AS (
    INSERT INTO delivery_attempt (notification_id, claim_token, number, channel, worker, started_at)
    SELECT id, claim_token, attempt_count, channel, %(worker)s, %(now)s FROM claimed
)
SELECT id, claim_token, client_id, channel, recipient, subject, body, metadata, priority,
       attempt_count, max_attempts, user_id, template, payload, fallback_channels,
       claim_expires_at
FROM claimed
ORDER BY priority, due_at, created_at;

-- name: notification_finish
-- Applies a batch of results. Each input row carries the claim token it was claimed under;
-- rows whose token no longer matches (the claim expired and was taken over) are left alone.
-- In-app messages reach the inbox in this same statement. Final statuses also get their
-- webhook event here, from the trigger on notification (see migration delivery 0002).
-- A fallback switch (channel and content non-null, attempt_reset true) moves the row to its
-- next channel with its attempts reset; the finished attempt row keeps the old channel, so
-- the history shows both.
WITH result AS (
    SELECT *
    FROM unnest(
        %(ids)s::uuid[], %(tokens)s::uuid[], %(statuses)s::text[], %(outcomes)s::text[],
        %(errors)s::text[], %(message_ids)s::text[], %(due_ats)s::timestamptz[],
        %(attempt_deltas)s::int[], %(attempt_resets)s::boolean[], %(channels)s::text[],
        %(recipients)s::text[], %(subjects)s::text[], %(bodies)s::text[], %(fallbacks)s::text[]
    ) AS r(id, claim_token, status, outcome, error, message_id, due_at, attempt_delta,
           attempt_reset, channel, recipient, subject, body, fallback_channels)
), finished AS (
    UPDATE notification AS n
    SET status = r.status,
        due_at = coalesce(r.due_at, n.due_at),
        attempt_count = CASE WHEN r.attempt_reset THEN 0
                             ELSE n.attempt_count + r.attempt_delta END,
        channel = coalesce(r.channel, n.channel),
        recipient = coalesce(r.recipient, n.recipient),
        subject = coalesce(r.subject, n.subject),
        body = coalesce(r.body, n.body),
        fallback_channels = coalesce(r.fallback_channels::jsonb, n.fallback_channels),
        last_error = CASE WHEN r.error IS NOT NULL THEN r.error ELSE n.last_error END,
        sent_at = CASE WHEN r.status = 'SENT' THEN %(now)s ELSE n.sent_at END,
        claim_token = NULL,
        claim_expires_at = NULL,
        updated_at = %(now)s
    FROM result AS r
    WHERE n.id = r.id AND n.claim_token = r.claim_token AND n.status = 'PROCESSING'
    RETURNING n.id, n.client_id, n.status, n.channel, n.recipient, n.subject, n.body, n.metadata,
              r.claim_token, r.outcome, r.error, r.message_id
), attempt AS (
    UPDATE delivery_attempt AS a
    SET finished_at = %(now)s, outcome = f.outcome, error = f.error,
        provider_message_id = f.message_id
    FROM finished AS f
    WHERE a.claim_token = f.claim_token
), uncounted AS (
    -- Only deliveries count against a recipient's rate limit: a failed attempt frees the
    -- slot it was admitted to.
    DELETE FROM ratelimit_delivery AS d
    USING finished AS f
    WHERE d.claim_token = f.claim_token AND f.status <> 'SENT'
), inbox AS (
    INSERT INTO inbox_message (id, client_id, user_id, notification_id, subject, body, metadata,
                               created_at)
    SELECT gen_random_uuid(), f.client_id, f.recipient, f.id, f.subject, f.body, f.metadata, %(now)s
    FROM finished AS f
    WHERE f.channel = 'in_app' AND f.status = 'SENT'
    ON CONFLICT (notification_id) DO NOTHING
)
SELECT id, status FROM finished;

-- name: notification_reclaim_expired
-- Returns rows whose claim expired (their worker died or stalled) to PENDING, due now. The
-- attempt the dead worker used stays counted. When that was already the final attempt the row
-- still gets one more claim (attempt_count may reach max_attempts + 1): the message may have
-- been delivered, and re-sending with the same idempotency key confirms it. A row that crashed
-- on that extra attempt too is dead-lettered.
WITH expired AS (
    SELECT id, claim_token, claimed_by
    FROM notification
    WHERE status = 'PROCESSING' AND claim_expires_at < %(now)s
    ORDER BY claim_expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), reclaimed AS (
    UPDATE notification AS n
    SET status = CASE WHEN n.attempt_count > n.max_attempts THEN 'DEAD_LETTERED' ELSE 'PENDING' END,
        last_error = 'claim expired: worker ' || e.claimed_by || ' did not report back',
        due_at = %(now)s,
        claim_token = NULL,
        claim_expires_at = NULL,
        updated_at = %(now)s
    FROM expired AS e
    WHERE n.id = e.id
    RETURNING n.id, n.status, e.claim_token
), attempt AS (
    UPDATE delivery_attempt AS a
    SET finished_at = %(now)s, outcome = 'ABANDONED', error = 'claim expired'
    FROM reclaimed AS r
    WHERE a.claim_token = r.claim_token
)
SELECT id, status FROM reclaimed;

-- name: notification_next_due_at
-- The earliest due time among waiting rows: one index probe per priority on the claim index.
SELECT min(head.due_at)
FROM (VALUES (0), (1), (2), (3)) AS p(priority)
CROSS JOIN LATERAL (
    SELECT due_at
    FROM notification
    WHERE status = 'PENDING' AND priority = p.priority
    ORDER BY due_at
    LIMIT 1
) AS head;

-- name: worker_heartbeat_upsert
INSERT INTO worker_heartbeat (worker_id, hostname, pid, started_at, last_seen_at, delivered)
VALUES (%(worker)s, %(hostname)s, %(pid)s, %(now)s, %(now)s, %(delivered)s)
ON CONFLICT (worker_id) DO UPDATE
SET last_seen_at = excluded.last_seen_at, delivered = excluded.delivered, stopped_at = NULL;

-- name: worker_heartbeat_stop
UPDATE worker_heartbeat SET stopped_at = %(now)s, last_seen_at = %(now)s, delivered = %(delivered)s
WHERE worker_id = %(worker)s;

-- name: simulated_message_call
-- Counts a call to the simulated provider; returns the call number and any final answer.
INSERT INTO simulated_provider_message AS m (idempotency_key, channel, recipient, calls, sends,
                                             first_call_at, last_call_at)
VALUES (%(key)s, %(channel)s, %(recipient)s, 1, 0, %(now)s, %(now)s)
ON CONFLICT (idempotency_key) DO UPDATE
SET calls = m.calls + 1, last_call_at = excluded.last_call_at
RETURNING calls, outcome, message_id;

-- name: simulated_message_answer
-- Settles the key's final answer once: if a concurrent call settled it first, nothing
-- changes and the caller reads that answer instead (simulated_message_get).
UPDATE simulated_provider_message
SET outcome = %(outcome)s, message_id = %(message_id)s,
    sends = sends + CASE WHEN %(outcome)s = 'ACCEPTED' THEN 1 ELSE 0 END
WHERE idempotency_key = %(key)s AND outcome IS NULL
RETURNING outcome, message_id;

-- name: simulated_message_get
SELECT outcome, message_id FROM simulated_provider_message WHERE idempotency_key = %(key)s;
