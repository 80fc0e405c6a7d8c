-- Copies a statement's changes of the events to the queue (a final event leaves it).
CREATE OR REPLACE FUNCTION webhook_queue_updated()
 RETURNS trigger
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
AS $function$
BEGIN
    DELETE FROM webhook_queue
    WHERE id = ANY (ARRAY(SELECT id FROM updated WHERE state NOT IN ('PENDING', 'DELIVERING')));
    INSERT INTO webhook_queue AS q (id, client_id, state, next_attempt_at, created_at, claim_expires_at, claimed_by)
    SELECT id, client_id, state, next_attempt_at, created_at, claim_expires_at, CASE WHEN state = 'DELIVERING' THEN claimed_by END FROM updated WHERE state IN ('PENDING', 'DELIVERING')
    ON CONFLICT (id) DO UPDATE
    SET client_id = excluded.client_id, state = excluded.state,
        next_attempt_at = excluded.next_attempt_at, claim_expires_at = excluded.claim_expires_at,
        claimed_by = excluded.claimed_by
    WHERE (q.client_id, q.state, q.next_attempt_at, q.claim_expires_at, q.claimed_by)
          IS DISTINCT FROM (excluded.client_id, excluded.state, excluded.next_attempt_at,
                            excluded.claim_expires_at, excluded.claimed_by);
    RETURN NULL;
END $function$;

CREATE OR REPLACE TRIGGER webhook_queue_updated AFTER UPDATE ON webhook_event REFERENCING NEW TABLE AS updated FOR EACH STATEMENT EXECUTE FUNCTION webhook_queue_updated();
