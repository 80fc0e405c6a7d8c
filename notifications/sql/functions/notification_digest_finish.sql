-- The end of a bucket's close, once every row is judged (notification_digest_collect): the
-- digest, rendered by the caller for p_digested rows, is created as a new PENDING notification
-- due now with the bucket's digest id (idempotency key `digest:<bucket id>`), from there on a
-- notification like any other; the bucket is CLOSED. Guarded by the claim (the bucket CLOSING
-- under p_token, locked) and by the count: when the rows DIGESTED under the bucket are not
-- p_digested, nothing is written (answers false) and the caller renders again. With no row to
-- carry, no digest is created and the bucket closes with no digest id.
CREATE OR REPLACE FUNCTION notification_digest_finish(p_bucket uuid, p_token uuid, p_digested integer, p_subject text, p_body text, p_priority integer, p_payload jsonb, p_metadata jsonb, p_fallback_channels jsonb, p_max_attempts integer)
 RETURNS TABLE(finished boolean, digest_id uuid)
 LANGUAGE plpgsql
AS $function$
DECLARE
    at_now timestamptz := notifyqueue_now();
    bucket notification_digest%ROWTYPE;
    counted integer;
BEGIN
    SELECT * INTO bucket FROM notification_digest AS d
     WHERE d.id = p_bucket AND d.claim_token = p_token AND d.state = 'CLOSING'
     FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT false, NULL::uuid;
        RETURN;
    END IF;
    SELECT count(*) INTO counted FROM notification AS n
     WHERE n.digest_bucket_id = p_bucket AND n.status = 'DIGESTED';
    IF counted <> p_digested THEN
        RETURN QUERY SELECT false, NULL::uuid;
        RETURN;
    END IF;
    IF counted > 0 THEN
        INSERT INTO notification (
            id, client_id, idempotency_key, request_fingerprint,
            channel, recipient, subject, body, priority, metadata,
            user_id, template, payload, fallback_channels,
            status, send_at, due_at, attempt_count, max_attempts, operator_retries,
            created_at, updated_at)
        VALUES (
            bucket.digest_id, bucket.client_id, 'digest:' || bucket.id, 'digest',
            bucket.channel, bucket.recipient, p_subject, p_body, p_priority, p_metadata,
            bucket.user_id, bucket.template, p_payload, p_fallback_channels,
            'PENDING', at_now, at_now, 0, p_max_attempts, 0, at_now, at_now)
        ON CONFLICT DO NOTHING;
    END IF;
    UPDATE notification_digest AS d
       SET state = 'CLOSED', digested = counted, closed_at = at_now,
           digest_id = CASE WHEN counted > 0 THEN d.digest_id END,
           claim_token = NULL, claim_expires_at = NULL
     WHERE d.id = p_bucket;
    RETURN QUERY SELECT true, CASE WHEN counted > 0 THEN bucket.digest_id END;
END $function$;
