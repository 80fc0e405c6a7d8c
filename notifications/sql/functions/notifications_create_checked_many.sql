-- Several gathered single creates, each with its key checked as notification_create_checked
-- checks it, in one statement. Keys are locked in one order, so gathered batches never deadlock;
-- lock_timeout bounds the wait behind another batch.
CREATE OR REPLACE FUNCTION notifications_create_checked_many(p_items jsonb)
 RETURNS TABLE(client_id uuid, idempotency_key text, id uuid, metadata jsonb, payload jsonb, fallback_channels jsonb, send_at timestamp with time zone, due_at timestamp with time zone, created_at timestamp with time zone, updated_at timestamp with time zone, expires_at timestamp with time zone)
 LANGUAGE plpgsql
 SET lock_timeout TO '50ms'
AS $function$
DECLARE
    at_now timestamptz := notifyqueue_now();
BEGIN
    RETURN QUERY
    INSERT INTO notification AS n (
        id, client_id, idempotency_key, request_fingerprint,
        channel, recipient, subject, body, priority, metadata,
        user_id, template, payload, fallback_channels,
        status, send_at, due_at, attempt_count, max_attempts, operator_retries,
        created_at, updated_at, expires_at, cancellation_key
    )
    SELECT notifyqueue_uuid7(), i.client_id, i.idempotency_key, i.request_fingerprint,
           i.channel, i.recipient, i.subject, i.body, i.priority, i.metadata::jsonb,
           i.user_id, i.template, i.payload::jsonb, i.fallback_channels::jsonb,
           'PENDING', due.at, due.at, 0, i.max_attempts, 0, at_now, at_now,
           CASE WHEN i.ttl_seconds IS NOT NULL
                  THEN due.at + make_interval(secs => i.ttl_seconds)
                ELSE i.expires_at END,
           i.cancellation_key
      FROM jsonb_to_recordset(p_items) AS i(
           client_id uuid, idempotency_key text, request_fingerprint text, channel text,
           recipient text, subject text, body text, priority smallint, metadata text,
           user_id text, template text, payload text, fallback_channels text,
           delay_seconds integer, send_at timestamptz, max_attempts integer,
           key_prefix text, hashed_key text, expires_at timestamptz, ttl_seconds integer,
           cancellation_key text)
     CROSS JOIN LATERAL (
        SELECT CASE WHEN i.delay_seconds IS NOT NULL
                      THEN at_now + make_interval(secs => i.delay_seconds)
                    ELSE greatest(coalesce(i.send_at, at_now), at_now)
               END AS at
     ) AS due
     WHERE EXISTS (
        SELECT 1
          FROM clients_clientapikey AS k
         WHERE k.prefix = i.key_prefix
           AND k.hashed_key = i.hashed_key
           AND k.client_id = i.client_id
           AND NOT k.revoked
           AND (k.expiry_date IS NULL OR k.expiry_date >= at_now))
     ORDER BY i.client_id, i.idempotency_key
    ON CONFLICT DO NOTHING
    RETURNING n.client_id, n.idempotency_key::text, n.id, nullif(n.metadata, '{}'::jsonb),
              n.payload, nullif(n.fallback_channels, '[]'::jsonb), n.send_at, n.due_at,
              n.created_at, n.updated_at, n.expires_at;
END $function$;
