-- The hold: claims whose provider's circuit was open, so the provider was never asked. Each is
-- given back PENDING with its attempt returned (its attempt row deleted, its rate-limit slot
-- freed), due at its circuit's probe time by the database's clock, and marked held since its
-- first refusal; one held longer than p_max_hold_s is DEAD_LETTERED instead, saying so. Guarded
-- by the claim's token and PROCESSING, as the finish is. One statement for a step's refusals.
CREATE OR REPLACE FUNCTION notification_circuit_hold_many(p_ids uuid[], p_tokens uuid[], p_circuits text[], p_cooldown_s double precision, p_max_hold_s double precision)
 RETURNS TABLE(id uuid, status character varying, channel character varying, client_id uuid, recipient character varying, freed_slot boolean, held_until timestamp with time zone)
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET plan_cache_mode TO 'force_custom_plan'
AS $function$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH refused AS (
        -- The probe time: an OPEN circuit's cooldown end; a HALF_OPEN one's probe is out, and
        -- its answer is due by the probe's expiry (a success lets the held rows go at once:
        -- notification_circuit_release); a circuit closed meanwhile, or unknown: now. The hold
        -- counts from the row's first refusal (`since`), never past the maximum hold.
        SELECT r.id, r.claim_token, r.circuit, h.since,
               h.since + make_interval(secs => p_max_hold_s) <= notifyqueue_now() AS over,
               greatest(notifyqueue_now(),
                        CASE c.state
                            WHEN 'OPEN' THEN c.opened_at + make_interval(secs => p_cooldown_s)
                            WHEN 'HALF_OPEN' THEN least(c.probe_expires_at, notifyqueue_now()
                                                        + make_interval(secs => p_cooldown_s))
                        END) AS probe_at
        FROM unnest(p_ids, p_tokens, p_circuits) AS r(id, claim_token, circuit)
        JOIN notification AS n ON n.id = r.id
        CROSS JOIN LATERAL (
            SELECT coalesce(n.circuit_held_since, notifyqueue_now()) AS since
        ) AS h
        LEFT JOIN circuit_breaker AS c ON c.name = r.circuit
    ), held AS (
        UPDATE notification AS n
        SET status = CASE WHEN r.over THEN 'DEAD_LETTERED' ELSE 'PENDING' END,
            -- A millisecond later per attempt the row has used: the held rows fall due
            -- together, and the claim's next probe is then the row tried least, not the row
            -- whose failed probe came back (probe after probe, it would run out of attempts).
            due_at = CASE WHEN r.over THEN n.due_at
                          ELSE least(r.probe_at + make_interval(secs => (n.attempt_count - 1)
                                                                        * 0.001),
                                     r.since + make_interval(secs => p_max_hold_s))
                     END,
            circuit_held_since = CASE WHEN r.over THEN NULL ELSE r.since END,
            last_error = CASE WHEN r.over
                              THEN format('circuit_open: held %s s while the %s circuit stayed '
                                          'open (the maximum hold); the provider was never asked',
                                          round(extract(epoch FROM notifyqueue_now() - r.since)),
                                          r.circuit)
                              ELSE n.last_error END,
            attempt_count = n.attempt_count - 1,
            rate_deferred_from = NULL,
            claim_token = NULL,
            claim_expires_at = NULL,
            updated_at = notifyqueue_now()
        FROM refused AS r
        WHERE n.id = r.id AND n.claim_token = r.claim_token AND n.status = 'PROCESSING'
        RETURNING n.id, n.status, n.channel, n.client_id, n.recipient, n.due_at, r.claim_token
    ), attempt AS (
        DELETE FROM delivery_attempt AS a
        USING held AS h
        WHERE a.claim_token = h.claim_token
    ), uncounted AS (
        DELETE FROM ratelimit_delivery AS d
        USING held AS h
        WHERE d.claim_token = h.claim_token
        RETURNING d.notification_id
    )
    SELECT h.id, h.status::varchar, h.channel::varchar, h.client_id, h.recipient,
           h.id IN (SELECT u.notification_id FROM uncounted AS u),
           CASE WHEN h.status = 'PENDING' THEN h.due_at END
    FROM held AS h;
END $function$;
