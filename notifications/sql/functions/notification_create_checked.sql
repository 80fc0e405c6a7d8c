-- The thin create path's insert with its API key checked in the same statement (the key with
-- this prefix and hash still the client's, unrevoked, unexpired by the database clock). A
-- function so that its plan is made once per connection. Answers only what the database chose.
-- A time to live counts from the send time (the due time it is given here).
CREATE OR REPLACE FUNCTION notification_create_checked(p_client_id uuid, p_idempotency_key text, p_request_fingerprint text, p_channel text, p_recipient text, p_subject text, p_body text, p_priority integer, p_metadata jsonb, p_user_id text, p_template text, p_payload jsonb, p_fallback_channels jsonb, p_delay_seconds integer, p_send_at timestamp with time zone, p_max_attempts integer, p_key_prefix text, p_hashed_key text, p_expires_at timestamp with time zone, p_ttl_seconds integer, p_cancellation_key text)
 RETURNS TABLE(id uuid, metadata jsonb, payload jsonb, fallback_channels jsonb, send_at timestamp with time zone, due_at timestamp with time zone, created_at timestamp with time zone, updated_at timestamp with time zone, expires_at timestamp with time zone)
 LANGUAGE plpgsql
AS $function$
DECLARE
    at_now timestamptz := notifyqueue_now();
    due timestamptz := CASE WHEN p_delay_seconds IS NOT NULL
                              THEN at_now + make_interval(secs => p_delay_seconds)
                            ELSE greatest(coalesce(p_send_at, at_now), at_now)
                       END;
BEGIN
    RETURN QUERY
    INSERT INTO notification AS n (
        id, client_id, idempotency_key, request_fingerprint,
        channel, recipient, subject, body, priority, metadata,
        user_id, template, payload, fallback_channels,
        status, send_at, due_at, attempt_count, max_attempts, operator_retries,
        created_at, updated_at, expires_at, cancellation_key
    )
    SELECT notifyqueue_uuid7(), p_client_id, p_idempotency_key, p_request_fingerprint,
           p_channel, p_recipient, p_subject, p_body, p_priority, p_metadata,
           p_user_id, p_template, p_payload, p_fallback_channels,
           'PENDING', due, due, 0, p_max_attempts, 0, at_now, at_now,
           CASE WHEN p_ttl_seconds IS NOT NULL THEN due + make_interval(secs => p_ttl_seconds)
                ELSE p_expires_at END,
           p_cancellation_key
     WHERE EXISTS (
        SELECT 1
          FROM clients_clientapikey AS k
         WHERE k.prefix = p_key_prefix
           AND k.hashed_key = p_hashed_key
           AND k.client_id = p_client_id
           AND NOT k.revoked
           AND (k.expiry_date IS NULL OR k.expiry_date >= at_now))
    ON CONFLICT DO NOTHING
    RETURNING n.id, nullif(n.metadata, '{}'::jsonb), n.payload,
              nullif(n.fallback_channels, '[]'::jsonb), n.send_at, n.due_at, n.created_at,
              n.updated_at, n.expires_at;
END $function$;
