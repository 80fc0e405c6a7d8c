-- A truncated record empties its queue too.
CREATE OR REPLACE FUNCTION notification_queue_truncated()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    DELETE FROM notification_queue;
    RETURN NULL;
END $function$;

CREATE OR REPLACE TRIGGER notification_queue_truncated AFTER TRUNCATE ON notification FOR EACH STATEMENT EXECUTE FUNCTION notification_queue_truncated();
