-- The finish: a batch of results, each applied only to a PROCESSING row still held under its
-- claim token; attempts finished, slots freed, in-app messages written to the inbox, all in one
-- statement. A function so that its plan is made once per connection.
CREATE OR REPLACE FUNCTION notification_finish_many(p_ids uuid[], p_tokens uuid[], p_statuses text[], p_outcomes text[], p_errors text[], p_message_ids text[], p_delays double precision[], p_attempt_deltas integer[], p_attempt_resets boolean[], p_channels text[], p_recipients text[], p_subjects text[], p_bodies text[], p_fallbacks text[])
 RETURNS TABLE(id uuid, status character varying, channel character varying, client_id uuid, recipient character varying, freed_slot boolean)
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET enable_hashjoin TO 'off'
 SET enable_mergejoin TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
#variable_conflict use_column
BEGIN
    -- Below the threshold a kept plan could be made from figures that cannot tell one
    -- index from another: each call is planned for itself instead.
    IF (SELECT c.reltuples FROM pg_class AS c WHERE c.oid = 'notification'::regclass)
       < 10000 THEN
        PERFORM set_config('plan_cache_mode', 'force_custom_plan', true);
    END IF;
    RETURN QUERY
    WITH result AS (
        SELECT *
        FROM unnest(
            p_ids, p_tokens, p_statuses, p_outcomes, p_errors, p_message_ids, p_delays,
            p_attempt_deltas, p_attempt_resets, p_channels, p_recipients, p_subjects, p_bodies,
            p_fallbacks
        ) AS r(id, claim_token, status, outcome, error, message_id, delay_s, attempt_delta,
               attempt_reset, channel, recipient, subject, body, fallback_channels)
    ), finished AS (
        UPDATE notification AS n
        SET status = r.status,
            due_at = CASE WHEN r.delay_s IS NULL THEN n.due_at
                          ELSE notifyqueue_now() + make_interval(secs => r.delay_s) END,
            attempt_count = CASE WHEN r.attempt_reset THEN 0
                                 ELSE n.attempt_count + r.attempt_delta END,
            channel = coalesce(r.channel, n.channel),
            recipient = coalesce(r.recipient, n.recipient),
            subject = coalesce(r.subject, n.subject),
            body = coalesce(r.body, n.body),
            fallback_channels = coalesce(r.fallback_channels::jsonb, n.fallback_channels),
            last_error = CASE WHEN r.error IS NOT NULL THEN r.error ELSE n.last_error END,
            sent_at = CASE WHEN r.status = 'SENT' THEN notifyqueue_now() ELSE n.sent_at END,
            -- A circuit hold ends with any result but a claim given back untried.
            circuit_held_since = CASE WHEN r.attempt_delta < 0 THEN n.circuit_held_since END,
            claim_token = NULL,
            claim_expires_at = NULL,
            -- The send that started has an answer: a row due again may be cancelled again.
            send_started_at = NULL,
            updated_at = notifyqueue_now()
        FROM result AS r
        WHERE n.id = ANY (ARRAY[r.id]) AND n.claim_token = r.claim_token AND n.status = 'PROCESSING'
        RETURNING n.id, n.client_id, n.status, n.channel, n.recipient, n.subject, n.body,
                  n.metadata, r.claim_token, r.outcome, r.error, r.message_id
    ), attempt AS (
        UPDATE delivery_attempt AS a
        SET finished_at = notifyqueue_now(), outcome = f.outcome, error = f.error,
            provider_message_id = f.message_id
        FROM finished AS f
        WHERE a.claim_token = f.claim_token
    ), uncounted AS (
        DELETE FROM ratelimit_delivery AS d
        USING finished AS f
        WHERE d.claim_token = f.claim_token AND f.status <> 'SENT'
        RETURNING d.notification_id
    ), inbox AS (
        INSERT INTO inbox_message (id, client_id, user_id, notification_id, subject, body,
                                   metadata, created_at)
        SELECT gen_random_uuid(), f.client_id, f.recipient, f.id, f.subject, f.body, f.metadata,
               notifyqueue_now()
        FROM finished AS f
        WHERE f.channel = 'in_app' AND f.status = 'SENT'
        ON CONFLICT (notification_id) DO NOTHING
    )
    SELECT f.id, f.status::varchar, f.channel::varchar, f.client_id, f.recipient,
           f.id IN (SELECT u.notification_id FROM uncounted AS u)
    FROM finished AS f;
END $function$;
