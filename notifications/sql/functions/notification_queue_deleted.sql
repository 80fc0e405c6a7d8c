-- Deleted records leave the queue with them.
CREATE OR REPLACE FUNCTION notification_queue_deleted()
 RETURNS trigger
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
AS $function$
BEGIN
    DELETE FROM notification_queue WHERE id = ANY (ARRAY(SELECT id FROM deleted));
    RETURN NULL;
END $function$;

CREATE OR REPLACE TRIGGER notification_queue_deleted AFTER DELETE ON notification REFERENCING OLD TABLE AS deleted FOR EACH STATEMENT EXECUTE FUNCTION notification_queue_deleted();
