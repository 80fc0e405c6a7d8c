-- The deferral (ratelimits' `ratelimit_defer` calls it). It ends a claim, guarded by the
-- claim's token and PROCESSING as the finish is, and finishes its attempt row, so it is the
-- worker's. Planned at each call for its values, as a statement sent on its own is. The two
-- last parameters have defaults so that a worker of the previous release, still running while
-- the migration lands, defers through this function.
CREATE OR REPLACE FUNCTION notification_rate_defer(
    p_channel text, p_client_id uuid, p_recipient text, p_notification_id uuid,
    p_claim_token uuid, p_limit integer, p_window_s double precision,
    p_recipient_key text DEFAULT NULL, p_ceiling integer DEFAULT 0)
RETURNS TABLE(due_at timestamptz)
LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan
AS $function$
#variable_conflict use_column
BEGIN
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
    RETURN QUERY
    WITH recent AS (
        SELECT at, row_number() OVER (ORDER BY at DESC) AS newest_first
        FROM ratelimit_delivery
        WHERE key = ratelimit_key(p_channel, p_client_id, coalesce(p_recipient_key, p_recipient))
          AND at > notifyqueue_now() - make_interval(secs => p_window_s)
    ), address AS (
        -- With the ceiling on, the address's newest p_ceiling deliveries across clients: when
        -- they fill it, nothing of this key can go before the oldest of them leaves the window.
        SELECT CASE WHEN count(*) >= p_ceiling
                    THEN min(at) + make_interval(secs => p_window_s) END AS free_at
        FROM (SELECT d.at FROM ratelimit_delivery AS d
              -- The address's entries of ratelimit_address_key_at only, newest first.
              WHERE p_ceiling > 0 AND p_channel <> 'in_app' AND d.address_key IS NOT NULL
                AND (d.address_key, d.at)
                    > (ratelimit_key(p_channel, NULL, coalesce(p_recipient_key, p_recipient)),
                       notifyqueue_now() - make_interval(secs => p_window_s))
                AND (d.address_key, d.at)
                    <= (ratelimit_key(p_channel, NULL, coalesce(p_recipient_key, p_recipient)), 'infinity'::timestamptz)
              ORDER BY d.address_key DESC, d.at DESC
              LIMIT p_ceiling) AS newest
    ), slot AS (
        SELECT at, row_number() OVER (ORDER BY at) - 1 AS k
        FROM recent
        WHERE newest_first <= p_limit
    ), waiting AS (
        SELECT n.id, coalesce(n.rate_deferred_from, n.due_at) AS own_due_at,
               row_number() OVER (ORDER BY n.priority, n.created_at, n.id) - 1 AS j
        FROM notification AS n
        -- Candidates: the claimed row, the recipient's PENDING rows (queue_pending_recipient) and
        -- the claims in flight (queue_claim_expiry): the recipient's backlog, never its history.
        WHERE n.id IN (SELECT p_notification_id::uuid
                       UNION ALL
                       SELECT q.id FROM notification_queue AS q
                       WHERE q.status = 'PENDING'
                         AND q.recipient_digest = md5(p_recipient)::uuid
                       UNION ALL
                       SELECT q.id FROM notification_queue AS q WHERE q.status = 'PROCESSING')
          -- The key's own rows as stored (a window is per channel, client and recipient); a
          -- row spelling the recipient another way is checked again when it is due.
          AND (n.id = p_notification_id
               OR (n.recipient = p_recipient
                   AND n.channel = p_channel AND n.client_id = p_client_id
                   AND n.priority > 0
                   AND n.send_at <= notifyqueue_now()
                   -- A row a digest bucket collected waits for the bucket's close, not a slot.
                   AND n.digest_bucket_id IS NULL
                   AND n.status IN ('PENDING', 'PROCESSING')
                   AND NOT EXISTS (SELECT 1 FROM ratelimit_delivery AS d
                                   WHERE d.claim_token = n.claim_token)))
    ), schedule AS (
        -- A row whose slot has no delivery behind it (one was deleted since the count: a failed
        -- attempt frees its slot without taking the lock) is due now and simply checked again.
        SELECT w.id, w.own_due_at,
               greatest(w.own_due_at,
                        coalesce(s.at + make_interval(secs => p_window_s * (w.j / p_limit + 1)),
                                 notifyqueue_now()),
                        (SELECT a.free_at FROM address AS a)) AS due_at
        FROM waiting AS w
        LEFT JOIN slot AS s ON s.k = w.j % p_limit
    ), others AS (
        UPDATE notification AS n
        SET due_at = sc.due_at,
            rate_deferred_from = CASE WHEN sc.due_at > sc.own_due_at THEN sc.own_due_at END,
            updated_at = notifyqueue_now()
        FROM schedule AS sc
        WHERE n.id = sc.id AND n.id <> p_notification_id
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
        WHERE n.id = sc.id AND n.id = p_notification_id
          AND n.claim_token = p_claim_token AND n.status = 'PROCESSING'
        RETURNING n.due_at
    ), attempt AS (
        UPDATE delivery_attempt
        SET finished_at = notifyqueue_now(), outcome = 'RATE_LIMITED'
        WHERE claim_token = p_claim_token AND EXISTS (SELECT 1 FROM deferred)
    )
    SELECT due_at FROM deferred;
END $function$;
