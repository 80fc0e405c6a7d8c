-- The per-recipient rolling window. `RateLimitRepository` is the only user of these statements.
-- A window is keyed by ratelimit_key(channel, client, recipient) (ratelimits/sql/functions/): the
-- address for email, SMS and push, across clients; (client, user) for in-app. Everything that
-- checks a key's count runs under that key's transaction-level advisory lock (taken inside
-- ratelimit_admit()), so two workers never both take the last slot; other keys hash to other
-- locks and are not blocked. Every time is notifyqueue_now(), the database's clock.

-- name: ratelimit_admit
-- Lock, forget what left the window, count, and record if under the limit (CRITICAL: record
-- without a check); when a slot is left over, let the next held row of the key go. The
-- function is in notifications/sql/functions/. True when admitted.
SELECT ratelimit_admit(%(channel)s, %(client_id)s, %(recipient)s, %(notification_id)s,
                       %(claim_token)s, %(limit)s, %(window_s)s, %(critical)s)

-- name: ratelimit_admit_many
-- ratelimit_admit for every row of a claim, in one statement: the keys' advisory locks are
-- taken in one global order (notifications/sql/functions/ratelimit_admit_many.sql), so concurrent callers cannot deadlock.
-- Returns each row's id and whether it was admitted.
SELECT notification_id, admitted
FROM ratelimit_admit_many(%(channels)s::text[], %(client_ids)s::uuid[], %(recipients)s::text[],
                          %(ids)s::uuid[], %(claim_tokens)s::uuid[], %(criticals)s::boolean[],
                          %(limit)s, %(window_s)s)

-- name: ratelimit_defer
-- The key is at its limit. Gives the claimed row back (PENDING, attempt returned), due at the
-- moment its slot frees, and schedules the key's whole backlog the same way, so each waiting
-- row becomes due exactly when a slot is free for it instead of being claimed and deferred
-- again every time any slot frees.
--
-- Slots: with the newest `limit` deliveries at t_0 <= ... <= t_{N-1}, the j-th waiting row
-- (in claim order) can go at t_{j mod N} + window * (j div N + 1). A row is never moved before
-- the time it had of its own (its send_at or retry backoff, kept in rate_deferred_from while a
-- deferral holds it later), but it is moved earlier when slots freed since it was scheduled
-- (a cancelled or failed row ahead of it). The claimed row is matched by its id: a send-time
-- re-check may have switched it to the user's new address, which the stored row does not show.
-- The check at claim time stays the authority; this schedule only keeps rows out of the way.
WITH recent AS (
    SELECT at, row_number() OVER (ORDER BY at DESC) AS newest_first
    FROM ratelimit_delivery
    WHERE key = ratelimit_key(%(channel)s, %(client_id)s, %(recipient)s)
      AND at > notifyqueue_now() - make_interval(secs => %(window_s)s)
), slot AS (
    SELECT at, row_number() OVER (ORDER BY at) - 1 AS k
    FROM recent
    WHERE newest_first <= %(limit)s
), waiting AS (
    SELECT n.id, coalesce(n.rate_deferred_from, n.due_at) AS own_due_at,
           row_number() OVER (ORDER BY n.priority, n.created_at, n.id) - 1 AS j
    FROM notification AS n
    -- Candidates: the claimed row, the recipient's PENDING rows (queue_pending_recipient) and
    -- the claims in flight (queue_claim_expiry): the recipient's backlog, never its history.
    WHERE n.id IN (SELECT %(notification_id)s::uuid
                   UNION ALL
                   SELECT q.id FROM notification_queue AS q
                   WHERE q.status = 'PENDING'
                     AND q.recipient_digest = md5(%(recipient)s)::uuid
                   UNION ALL
                   SELECT q.id FROM notification_queue AS q WHERE q.status = 'PROCESSING')
      AND (n.id = %(notification_id)s
           OR (n.recipient = %(recipient)s
               AND CASE WHEN %(channel)s = 'in_app'
                        THEN n.channel = 'in_app' AND n.client_id = %(client_id)s
                        ELSE n.channel <> 'in_app' END
               AND n.priority > 0
               AND n.send_at <= notifyqueue_now()
               AND n.status IN ('PENDING', 'PROCESSING')
               AND NOT EXISTS (SELECT 1 FROM ratelimit_delivery AS d
                               WHERE d.claim_token = n.claim_token)))
), schedule AS (
    -- A row whose slot has no delivery behind it (one was deleted since the count: a failed
    -- attempt frees its slot without taking the lock) is due now and simply checked again.
    SELECT w.id, w.own_due_at,
           greatest(w.own_due_at,
                    coalesce(s.at + make_interval(secs => %(window_s)s * (w.j / %(limit)s + 1)),
                             notifyqueue_now())) AS due_at
    FROM waiting AS w
    LEFT JOIN slot AS s ON s.k = w.j %% %(limit)s
), others AS (
    UPDATE notification AS n
    SET due_at = sc.due_at,
        rate_deferred_from = CASE WHEN sc.due_at > sc.own_due_at THEN sc.own_due_at END,
        updated_at = notifyqueue_now()
    FROM schedule AS sc
    WHERE n.id = sc.id AND n.id <> %(notification_id)s
      AND n.status = 'PENDING' AND n.due_at <> sc.due_at
), deferred AS (
    UPDATE notification AS n
    SET status = 'PENDING',
        due_at = sc.due_at,
        rate_deferred_from = CASE WHEN sc.due_at > sc.own_due_at THEN sc.own_due_at END,
        attempt_count = n.attempt_count - 1,
        claim_token = NULL,
        claim_expires_at = NULL,
        updated_at = notifyqueue_now()
    FROM schedule AS sc
    WHERE n.id = sc.id AND n.id = %(notification_id)s
      AND n.claim_token = %(claim_token)s AND n.status = 'PROCESSING'
    RETURNING n.due_at
), attempt AS (
    UPDATE delivery_attempt
    SET finished_at = notifyqueue_now(), outcome = 'RATE_LIMITED'
    WHERE claim_token = %(claim_token)s AND EXISTS (SELECT 1 FROM deferred)
)
SELECT due_at FROM deferred

-- name: ratelimit_release_freed
-- Failed attempts freed their slots (their window rows were deleted by the finish): for each
-- such key, the next row a deferral holds back may go now. Only a key with a held row has
-- anything to release: a probe of notification_rate_held tells first, as in the admission, so
-- a claim that failed whole (a provider down) does not call the function for every row.
SELECT ratelimit_release_next(f.channel, f.client_id, f.recipient, f.id)
FROM unnest(%(channels)s::text[], %(client_ids)s::uuid[], %(recipients)s::text[], %(ids)s::uuid[])
     AS f(channel, client_id, recipient, id)
WHERE EXISTS (SELECT 1 FROM notification AS w
              WHERE md5(w.recipient)::uuid = md5(f.recipient)::uuid
                AND w.recipient = f.recipient AND w.rate_deferred_from IS NOT NULL)

-- name: ratelimit_prune
-- Forgets deliveries that have left every window, a bounded number at a time.
DELETE FROM ratelimit_delivery
WHERE claim_token IN (
    SELECT claim_token FROM ratelimit_delivery
    WHERE at <= notifyqueue_now() - make_interval(secs => %(window_s)s)
    LIMIT %(limit)s
)
