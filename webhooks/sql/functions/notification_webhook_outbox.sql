-- The outbox: a statement that gives notifications a final status writes their webhook events
-- in the same transaction, so an event is never lost nor sent for a change that rolled back.
CREATE OR REPLACE FUNCTION notification_webhook_outbox()
 RETURNS trigger
 LANGUAGE plpgsql
 SET work_mem TO '256MB'
AS $function$
BEGIN
    IF NOT EXISTS (SELECT FROM outbox_new
                   WHERE status IN ('SENT', 'FAILED', 'DEAD_LETTERED', 'SUPPRESSED', 'EXPIRED', 'DIGESTED')) THEN
        RETURN NULL;
    END IF;
    INSERT INTO webhook_event (id, client_id, notification_id, status, attempt_count,
                               occurred_at, state, delivery_attempts, next_attempt_at, created_at)
    SELECT gen_random_uuid(), after.client_id, after.id, after.status, after.attempt_count,
           after.updated_at, 'PENDING', 0, after.updated_at, after.updated_at
    FROM outbox_new AS after
    JOIN clients_client AS c ON c.id = after.client_id
    WHERE after.status IN ('SENT', 'FAILED', 'DEAD_LETTERED', 'SUPPRESSED', 'EXPIRED', 'DIGESTED')
      -- Its status changed. A hashed subplan: the planner takes a transition table for one
      -- row, so a join of the two would be a nested loop, one row times the other.
      AND (after.id, after.status) NOT IN (SELECT id, status FROM outbox_old)
      AND c.webhook_url <> '';
    RETURN NULL;
END $function$;

CREATE OR REPLACE TRIGGER notification_webhook_outbox AFTER UPDATE ON notification REFERENCING OLD TABLE AS outbox_old NEW TABLE AS outbox_new FOR EACH STATEMENT EXECUTE FUNCTION notification_webhook_outbox();
