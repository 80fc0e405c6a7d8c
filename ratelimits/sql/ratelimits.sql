-- The per-recipient rolling window. `RateLimitRepository` is the only user of these statements.
-- Everything that checks a recipient's count runs under that recipient's transaction-level
-- advisory lock (taken inside ratelimit_admit()), so two workers never both take the last
-- slot; other recipients hash to other locks and are not blocked.

-- name: ratelimit_admit
-- Lock, forget what left the window, count, and record if under the limit (CRITICAL: record
-- without a check). The function is in migration ratelimits 0002. True when admitted.
SELECT ratelimit_admit(%(recipient)s, %(now)s, %(notification_id)s, %(claim_token)s,
                       %(limit)s, %(window_s)s, %(critical)s)

-- name: ratelimit_defer
-- The recipient is at its limit. Gives the claimed row back (PENDING, attempt returned), due
-- at the moment its slot frees, and schedules the recipient's whole backlog the same way, so
-- each waiting row becomes due exactly when a slot is free for it instead of being claimed
-- and deferred again every time any slot frees.
--
-- Slots: with the newest `limit` deliveries at t_0 <= ... <= t_{N-1}, the j-th waiting row
-- (in claim order) can go at t_{j mod N} + window * (j div N + 1). Rows are only ever moved
-- later (a client's later send_at, or a retry's backoff, is kept); the check at claim time
-- stays the authority, this schedule only keeps rows out of the way until then.
WITH recent AS (
    SELECT at, row_number() OVER (ORDER BY at DESC) AS newest_first
    FROM ratelimit_delivery
    WHERE recipient = %(recipient)s AND at > %(now)s - make_interval(secs => %(window_s)s)
), slot AS (
    SELECT at, row_number() OVER (ORDER BY at) - 1 AS k
    FROM recent
    WHERE newest_first <= %(limit)s
), waiting AS (
    SELECT n.id, n.due_at, row_number() OVER (ORDER BY n.priority, n.created_at, n.id) - 1 AS j
    FROM notification AS n
    WHERE n.recipient = %(recipient)s
      AND n.priority > 0
      AND n.send_at <= %(now)s
      AND n.status IN ('PENDING', 'PROCESSING')
      AND NOT EXISTS (SELECT 1 FROM ratelimit_delivery AS d WHERE d.claim_token = n.claim_token)
), schedule AS (
    -- A row whose slot has no delivery behind it (one was deleted since the count: a failed
    -- attempt frees its slot without taking the lock) is due now and simply checked again.
    SELECT w.id,
           greatest(w.due_at,
                    coalesce(s.at + make_interval(secs => %(window_s)s * (w.j / %(limit)s + 1)),
                             %(now)s)) AS due_at
    FROM waiting AS w
    LEFT JOIN slot AS s ON s.k = w.j %% %(limit)s
), others AS (
    UPDATE notification AS n
    SET due_at = sc.due_at, updated_at = %(now)s
    FROM schedule AS sc
    WHERE n.id = sc.id AND n.id <> %(notification_id)s
      AND n.status = 'PENDING' AND n.due_at < sc.due_at
), deferred AS (
    UPDATE notification AS n
    SET status = 'PENDING',
        due_at = sc.due_at,
        attempt_count = n.attempt_count - 1,
        claim_token = NULL,
        claim_expires_at = NULL,
        updated_at = %(now)s
    FROM schedule AS sc
    WHERE n.id = sc.id AND n.id = %(notification_id)s
      AND n.claim_token = %(claim_token)s AND n.status = 'PROCESSING'
    RETURNING n.due_at
), attempt AS (
    UPDATE delivery_attempt
    SET finished_at = %(now)s, outcome = 'RATE_LIMITED'
    WHERE claim_token = %(claim_token)s AND EXISTS (SELECT 1 FROM deferred)
)
SELECT due_at FROM deferred

-- name: ratelimit_prune
-- Forgets deliveries that have left every window, a bounded number at a time.
DELETE FROM ratelimit_delivery
WHERE id IN (
    SELECT id FROM ratelimit_delivery
    WHERE at <= %(now)s - make_interval(secs => %(window_s)s)
    LIMIT %(limit)s
)
