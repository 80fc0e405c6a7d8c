-- Truncated events empty their queue too.
CREATE OR REPLACE FUNCTION webhook_queue_truncated()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    DELETE FROM webhook_queue;
    RETURN NULL;
END $function$;

CREATE OR REPLACE TRIGGER webhook_queue_truncated AFTER TRUNCATE ON webhook_event FOR EACH STATEMENT EXECUTE FUNCTION webhook_queue_truncated();
