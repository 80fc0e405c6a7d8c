-- A user's time zone or quiet hours changed (or their preferences were deleted): the rows the
-- user's quiet hours hold are re-timed to the new ones in the same statement, by the database
-- clock: each still inside a window waits until its new end; each no window holds any more is
-- due now and held no longer. Only PENDING held rows move, found through
-- notification_quiet_held (client_id, user_id), so the cost is the user's held rows. A row a
-- worker holds (PROCESSING) is left to the send-time stage, which reads the new preferences.
CREATE OR REPLACE FUNCTION user_preferences_quiet_hours_changed()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
DECLARE
    kept user_preferences;
BEGIN
    IF TG_OP = 'DELETE' THEN
        kept := OLD;
        kept.quiet_hours := '[]'::jsonb;
    ELSE
        kept := NEW;
    END IF;
    WITH held AS (
        SELECT m.id,
               CASE WHEN m.priority > 0
                    THEN quiet_hours_until(notifyqueue_now(), kept.timezone, kept.quiet_hours,
                                           m.channel)
               END AS until
        FROM notification AS m
        WHERE m.client_id = kept.client_id AND m.user_id = kept.user_id
          AND m.quiet_held_since IS NOT NULL AND m.status = 'PENDING'
    )
    UPDATE notification AS n
    SET due_at = coalesce(h.until, notifyqueue_now()),
        quiet_held_since = CASE WHEN h.until IS NULL THEN NULL ELSE n.quiet_held_since END,
        updated_at = notifyqueue_now()
    FROM held AS h
    WHERE n.id = h.id AND n.quiet_held_since IS NOT NULL AND n.status = 'PENDING';
    RETURN NULL;
END $function$;

CREATE OR REPLACE TRIGGER user_preferences_quiet_hours_changed AFTER UPDATE OF timezone, quiet_hours ON user_preferences FOR EACH ROW WHEN (OLD.timezone IS DISTINCT FROM NEW.timezone OR OLD.quiet_hours IS DISTINCT FROM NEW.quiet_hours) EXECUTE FUNCTION user_preferences_quiet_hours_changed();

CREATE OR REPLACE TRIGGER user_preferences_quiet_hours_deleted AFTER DELETE ON user_preferences FOR EACH ROW EXECUTE FUNCTION user_preferences_quiet_hours_changed();
