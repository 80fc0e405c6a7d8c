-- Deleted events leave the queue with them.
CREATE OR REPLACE FUNCTION webhook_queue_deleted()
 RETURNS trigger
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
AS $function$
BEGIN
    DELETE FROM webhook_queue WHERE id = ANY (ARRAY(SELECT id FROM deleted));
    RETURN NULL;
END $function$;

CREATE OR REPLACE TRIGGER webhook_queue_deleted AFTER DELETE ON webhook_event REFERENCING OLD TABLE AS deleted FOR EACH STATEMENT EXECUTE FUNCTION webhook_queue_deleted();
