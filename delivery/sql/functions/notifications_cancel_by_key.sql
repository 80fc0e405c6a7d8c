-- A cancel by key, one batch: up to p_limit of the client's rows with this cancellation key
-- whose send has not started (PENDING, whatever holds it, or claimed by a worker that has not
-- yet marked the send started) end CANCELLED. A claimed row's claim ends with it: its attempt
-- given back and finished CANCELLED, its rate-limit slot freed; the worker's later steps on it
-- (its last check before the provider, its finish) find the claim gone and change nothing.
-- Found through queue_cancellable (the client's unsent rows with the key's digest), the key
-- itself compared on the record, each row's state re-checked on its locked version. SKIP
-- LOCKED: a cancel never waits for a worker (nor a worker long for a cancel: one batch's
-- statement), so the two never deadlock. `remaining` says whether a candidate was left, locked
-- by another transaction at that moment or past the limit; the caller repeats the batch until
-- none is.
CREATE OR REPLACE FUNCTION notifications_cancel_by_key(p_client_id uuid, p_key text, p_limit integer)
 RETURNS TABLE(cancelled integer, remaining boolean)
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET plan_cache_mode TO 'force_custom_plan'
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH chosen AS (
        SELECT n.id, n.claim_token
        FROM notification_queue AS q
        JOIN notification AS n ON n.id = q.id
        WHERE q.client_id = p_client_id AND q.cancellation_digest = md5(p_key)::uuid
          AND q.status IN ('PENDING', 'PROCESSING')
          AND n.cancellation_key = p_key AND n.status IN ('PENDING', 'PROCESSING')
          AND n.send_started_at IS NULL
        LIMIT p_limit
        FOR UPDATE OF n SKIP LOCKED
    ), cancelled AS (
        UPDATE notification AS n
        SET status = 'CANCELLED',
            attempt_count = n.attempt_count - CASE WHEN n.status = 'PROCESSING' THEN 1 ELSE 0 END,
            claim_token = NULL,
            claim_expires_at = NULL,
            rate_deferred_from = NULL,
            circuit_held_since = NULL,
            quiet_held_since = NULL,
            updated_at = notifyqueue_now()
        FROM chosen AS c
        WHERE n.id = c.id AND n.status IN ('PENDING', 'PROCESSING') AND n.send_started_at IS NULL
        RETURNING n.id, c.claim_token
    ), attempt AS (
        UPDATE delivery_attempt AS a
        SET finished_at = notifyqueue_now(), outcome = 'CANCELLED',
            error = 'cancelled by key before the send started'
        FROM cancelled AS x
        WHERE x.claim_token IS NOT NULL AND a.claim_token = x.claim_token
    ), unslotted AS (
        DELETE FROM ratelimit_delivery AS d
        USING cancelled AS x
        WHERE x.claim_token IS NOT NULL AND d.claim_token = x.claim_token
    )
    SELECT (SELECT count(*) FROM cancelled)::integer,
           EXISTS (
               SELECT 1
               FROM notification_queue AS q
               JOIN notification AS n ON n.id = q.id
               WHERE q.client_id = p_client_id AND q.cancellation_digest = md5(p_key)::uuid
                 AND q.status IN ('PENDING', 'PROCESSING')
                 AND n.cancellation_key = p_key AND n.status IN ('PENDING', 'PROCESSING')
                 AND n.send_started_at IS NULL
                 AND n.id NOT IN (SELECT c.id FROM chosen AS c));
END $function$;
