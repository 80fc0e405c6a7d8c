-- Copies a statement's changes of the record to the queue (a SENT row leaves it); rows are found
-- by the queue's key, never by a scan. The expiry and the cancellation key's digest never change
-- after the insert, so an update leaves them as they are.
CREATE OR REPLACE FUNCTION notification_queue_updated()
 RETURNS trigger
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
AS $function$
BEGIN
    DELETE FROM notification_queue
    WHERE id = ANY (ARRAY(SELECT id FROM updated WHERE status = 'SENT'));
    INSERT INTO notification_queue AS q (id, client_id, status, priority, channel, due_at, created_at, claim_expires_at, claimed_by, recipient_digest, expires_at, cancellation_digest)
    SELECT id, client_id, status, priority, channel, due_at, created_at, claim_expires_at, CASE WHEN status = 'PROCESSING' THEN claimed_by END, CASE WHEN status = 'PENDING' THEN md5(recipient)::uuid END, expires_at, md5(cancellation_key)::uuid FROM updated WHERE status <> 'SENT'
    ON CONFLICT (id) DO UPDATE
    SET status = excluded.status, priority = excluded.priority, channel = excluded.channel,
        due_at = excluded.due_at, claim_expires_at = excluded.claim_expires_at,
        claimed_by = excluded.claimed_by, recipient_digest = excluded.recipient_digest
    WHERE (q.status, q.priority, q.channel, q.due_at, q.claim_expires_at, q.claimed_by,
           q.recipient_digest)
          IS DISTINCT FROM (excluded.status, excluded.priority, excluded.channel,
                            excluded.due_at, excluded.claim_expires_at, excluded.claimed_by,
                            excluded.recipient_digest);
    RETURN NULL;
END $function$;

CREATE OR REPLACE TRIGGER notification_queue_updated AFTER UPDATE ON notification REFERENCING NEW TABLE AS updated FOR EACH STATEMENT EXECUTE FUNCTION notification_queue_updated();
