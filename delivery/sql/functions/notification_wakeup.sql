-- Wakes a waiting worker (NOTIFY) when a row becomes PENDING, only while some worker waits
-- (worker_heartbeat.waiting): a busy queue sends no notifications.
CREATE OR REPLACE FUNCTION notification_wakeup()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtext('notifyqueue:wakeup'));
    IF EXISTS (SELECT 1 FROM worker_heartbeat WHERE waiting) THEN
        PERFORM pg_notify('notifyqueue_due', '');
    END IF;
    RETURN NULL;
END $function$;

CREATE OR REPLACE TRIGGER notification_wakeup_insert AFTER INSERT ON notification FOR EACH STATEMENT EXECUTE FUNCTION notification_wakeup();

CREATE OR REPLACE TRIGGER notification_wakeup_pending AFTER UPDATE OF status ON notification FOR EACH ROW WHEN ((((new.status)::text = 'PENDING'::text) AND ((old.status)::text <> 'PENDING'::text))) EXECUTE FUNCTION notification_wakeup();
