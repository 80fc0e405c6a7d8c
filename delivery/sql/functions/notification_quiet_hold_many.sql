-- The quiet-hours stage: of a step's claims for users (preference mode, not CRITICAL), those
-- whose user's quiet hours hold them now, by the database clock and the user's current time
-- zone and windows (quiet_hours_until), are given back PENDING with their attempt returned
-- (their attempt row deleted: the provider was never asked), due at the window's end and
-- marked held since their first quiet hold; the other claims go on, and one that a quiet hold
-- had marked is marked no longer. Guarded by the claim's token and PROCESSING, as the finish
-- is. One statement for the step; it answers the held rows with their held_until.
CREATE OR REPLACE FUNCTION notification_quiet_hold_many(p_ids uuid[], p_tokens uuid[], p_channels text[])
 RETURNS TABLE(id uuid, held_until timestamp with time zone)
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_custom_plan'
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH claimed AS (
        -- The channel is the claim's: the preferences stage before this one may have moved it.
        SELECT r.id, r.claim_token, n.quiet_held_since,
               CASE WHEN n.priority > 0
                    THEN quiet_hours_until(notifyqueue_now(), p.timezone, p.quiet_hours, r.channel)
               END AS until
        FROM unnest(p_ids, p_tokens, p_channels) AS r(id, claim_token, channel)
        JOIN notification AS n ON n.id = r.id
        LEFT JOIN user_preferences AS p ON p.client_id = n.client_id AND p.user_id = n.user_id
        WHERE n.claim_token = r.claim_token AND n.status = 'PROCESSING'
    ), held AS (
        UPDATE notification AS n
        SET status = 'PENDING',
            due_at = c.until,
            quiet_held_since = coalesce(n.quiet_held_since, notifyqueue_now()),
            rate_deferred_from = NULL,
            circuit_held_since = NULL,
            attempt_count = n.attempt_count - 1,
            claim_token = NULL,
            claim_expires_at = NULL,
            updated_at = notifyqueue_now()
        FROM claimed AS c
        WHERE n.id = c.id AND c.until IS NOT NULL
          AND n.claim_token = c.claim_token AND n.status = 'PROCESSING'
        RETURNING n.id, n.due_at, c.claim_token
    ), attempt AS (
        DELETE FROM delivery_attempt AS a
        USING held AS h
        WHERE a.claim_token = h.claim_token
    ), passed AS (
        UPDATE notification AS n
        SET quiet_held_since = NULL
        FROM claimed AS c
        WHERE n.id = c.id AND c.until IS NULL AND c.quiet_held_since IS NOT NULL
          AND n.claim_token = c.claim_token AND n.status = 'PROCESSING'
    )
    SELECT h.id, h.due_at FROM held AS h;
END $function$;
