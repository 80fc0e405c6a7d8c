-- webhook_queue holds the events not yet final. These statement-level triggers keep it equal to
-- webhook_event, whatever statement writes the events.
CREATE OR REPLACE FUNCTION webhook_queue_inserted()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    INSERT INTO webhook_queue (id, client_id, state, next_attempt_at, created_at, claim_expires_at, claimed_by)
    SELECT id, client_id, state, next_attempt_at, created_at, claim_expires_at, CASE WHEN state = 'DELIVERING' THEN claimed_by END FROM inserted WHERE state IN ('PENDING', 'DELIVERING');
    RETURN NULL;
END $function$;

CREATE OR REPLACE TRIGGER webhook_queue_inserted AFTER INSERT ON webhook_event REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION webhook_queue_inserted();
