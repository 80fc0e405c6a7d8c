-- notification_queue holds every notification not SENT. These statement-level triggers keep it
-- equal to the record, whatever statement writes the record, at one call per statement.
CREATE OR REPLACE FUNCTION notification_queue_inserted()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    INSERT INTO notification_queue (id, client_id, status, priority, channel, due_at, created_at, claim_expires_at, claimed_by, recipient_digest, expires_at, cancellation_digest)
    SELECT id, client_id, status, priority, channel, due_at, created_at, claim_expires_at, CASE WHEN status = 'PROCESSING' THEN claimed_by END, CASE WHEN status = 'PENDING' THEN md5(recipient)::uuid END, expires_at, md5(cancellation_key)::uuid FROM inserted WHERE status <> 'SENT';
    RETURN NULL;
END $function$;

CREATE OR REPLACE TRIGGER notification_queue_inserted AFTER INSERT ON notification REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION notification_queue_inserted();
