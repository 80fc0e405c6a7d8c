-- A create with a digest key: the first of its identity (client, channel, user or recipient,
-- digest key) in a window is queued as any create and opens the window's bucket; the others
-- inside the window join that bucket, PENDING at DIGEST_HELD_DUE_AT (never claimed), until the
-- bucket's close ends them DIGESTED. The window is p_window_seconds from the opening create, or
-- until the next p_digest_at ('HH:MM') of the user's time zone (UTC for a direct recipient).
--
-- Creates of one identity take turns (a transaction-scoped advisory lock on it), so the
-- idempotency key's holder, the open bucket and the new row are decided by one create at a
-- time. A create joins only an OPEN bucket whose window has not ended, locked FOR UPDATE: the
-- close claims a bucket with SKIP LOCKED under the same lock, so once a bucket is CLOSING no
-- row joins it and its rows are fixed. An OPEN bucket whose window ended, found before the
-- close took it, is sealed here (CLOSING, unclaimed: the close takes it) and a new window opens.
-- Answers whether the row is new and its id; nothing when another transaction holds the key
-- and did not commit by the time it was looked for (the caller asks again).
CREATE OR REPLACE FUNCTION notification_digest_create(p_client_id uuid, p_idempotency_key text, p_request_fingerprint text, p_channel text, p_recipient text, p_subject text, p_body text, p_priority integer, p_metadata jsonb, p_user_id text, p_template text, p_payload jsonb, p_fallback_channels jsonb, p_max_attempts integer, p_expires_at timestamp with time zone, p_ttl_seconds integer, p_cancellation_key text, p_digest_key text, p_window_seconds integer, p_digest_at text)
 RETURNS TABLE(created boolean, notification_id uuid)
 LANGUAGE plpgsql
AS $function$
DECLARE
    at_now timestamptz := notifyqueue_now();
    who text := jsonb_build_array(p_client_id, p_channel,
                                  CASE WHEN p_user_id IS NOT NULL THEN 'user' ELSE 'to' END,
                                  coalesce(p_user_id, p_recipient), p_digest_key)::text;
    identity_digest uuid := md5(who)::uuid;
    zone text := 'UTC';
    local_now timestamp;
    closes timestamptz;
    bucket record;
    new_id uuid := notifyqueue_uuid7();
    inserted uuid;
    joins boolean := false;
BEGIN
    PERFORM pg_advisory_xact_lock(('x' || left(md5(who), 16))::bit(64)::bigint);
    -- The key's holder, committed before this create took the identity's turn.
    SELECT n.id INTO inserted FROM notification AS n
     WHERE n.client_id = p_client_id AND n.idempotency_key = p_idempotency_key;
    IF FOUND THEN
        RETURN QUERY SELECT false, inserted;
        RETURN;
    END IF;
    SELECT d.id, d.closes_at INTO bucket FROM notification_digest AS d
     WHERE d.identity = identity_digest AND d.state = 'OPEN'
     FOR UPDATE;
    IF FOUND THEN
        joins := bucket.closes_at > at_now;
        IF NOT joins THEN
            UPDATE notification_digest SET state = 'CLOSING' WHERE id = bucket.id;
        END IF;
    END IF;
    IF joins THEN
        INSERT INTO notification AS n (
            id, client_id, idempotency_key, request_fingerprint,
            channel, recipient, subject, body, priority, metadata,
            user_id, template, payload, fallback_channels,
            status, send_at, due_at, attempt_count, max_attempts, operator_retries,
            created_at, updated_at, expires_at, cancellation_key,
            digest_bucket_id, digest_closes_at
        ) VALUES (
            new_id, p_client_id, p_idempotency_key, p_request_fingerprint,
            p_channel, p_recipient, p_subject, p_body, p_priority, p_metadata,
            p_user_id, p_template, p_payload, p_fallback_channels,
            'PENDING', at_now, '9999-01-01T00:00:00+00:00', 0, p_max_attempts, 0,
            at_now, at_now,
            CASE WHEN p_ttl_seconds IS NOT NULL THEN at_now + make_interval(secs => p_ttl_seconds)
                 ELSE p_expires_at END,
            p_cancellation_key, bucket.id, bucket.closes_at)
        ON CONFLICT DO NOTHING
        RETURNING n.id INTO inserted;
        IF inserted IS NOT NULL THEN
            UPDATE notification_digest SET collected = collected + 1 WHERE id = bucket.id;
        END IF;
    ELSE
        INSERT INTO notification AS n (
            id, client_id, idempotency_key, request_fingerprint,
            channel, recipient, subject, body, priority, metadata,
            user_id, template, payload, fallback_channels,
            status, send_at, due_at, attempt_count, max_attempts, operator_retries,
            created_at, updated_at, expires_at, cancellation_key
        ) VALUES (
            new_id, p_client_id, p_idempotency_key, p_request_fingerprint,
            p_channel, p_recipient, p_subject, p_body, p_priority, p_metadata,
            p_user_id, p_template, p_payload, p_fallback_channels,
            'PENDING', at_now, at_now, 0, p_max_attempts, 0, at_now, at_now,
            CASE WHEN p_ttl_seconds IS NOT NULL THEN at_now + make_interval(secs => p_ttl_seconds)
                 ELSE p_expires_at END,
            p_cancellation_key)
        ON CONFLICT DO NOTHING
        RETURNING n.id INTO inserted;
        IF inserted IS NOT NULL THEN
            IF p_digest_at IS NOT NULL THEN
                IF p_user_id IS NOT NULL THEN
                    SELECT coalesce(p.timezone, 'UTC') INTO zone FROM user_preferences AS p
                     WHERE p.client_id = p_client_id AND p.user_id = p_user_id;
                    zone := coalesce(zone, 'UTC');
                END IF;
                local_now := at_now AT TIME ZONE zone;
                closes := (local_now::date + p_digest_at::time) AT TIME ZONE zone;
                IF closes <= at_now THEN
                    closes := (local_now::date + 1 + p_digest_at::time) AT TIME ZONE zone;
                END IF;
            ELSE
                closes := at_now + make_interval(secs => p_window_seconds);
            END IF;
            INSERT INTO notification_digest (
                id, client_id, identity, digest_key, channel, recipient, user_id, template,
                opened_by, opened_at, closes_at, collected, state)
            VALUES (notifyqueue_uuid7(), p_client_id, identity_digest, p_digest_key, p_channel,
                    p_recipient, p_user_id, p_template, inserted, at_now, closes, 0, 'OPEN');
        END IF;
    END IF;
    IF inserted IS NOT NULL THEN
        RETURN QUERY SELECT true, inserted;
        RETURN;
    END IF;
    -- Another transaction inserted the key meanwhile (another identity's create): its row.
    RETURN QUERY SELECT false, n.id FROM notification AS n
     WHERE n.client_id = p_client_id AND n.idempotency_key = p_idempotency_key;
END $function$;
