-- Drops one week's partition of `notification` (history_partition_add), the end of retention
-- for a week (delivery/retention.py), once its rows' other history is gone (history_week_prune_batch).
-- Under an ACCESS EXCLUSIVE lock on `notification`, taken first and held for this short
-- statement (lock_timeout bounds the wait, and every statement on the table waits behind it),
-- so no row of the week can change meanwhile: it checks again that none is waiting or in
-- flight (an operator's retry since the caller's check), deletes the queue copies still there
-- (FAILED and DEAD_LETTERED rows, which an operator may retry until now) and drops the table.
-- The queue's statement triggers never fire for a dropped partition, hence the delete. Returns
-- whether the week went.
CREATE OR REPLACE FUNCTION notification_week_drop(p_week regclass)
 RETURNS boolean
 LANGUAGE plpgsql
 SET lock_timeout TO '500ms'
AS $function$
DECLARE
    week record;
BEGIN
    LOCK TABLE notification IN ACCESS EXCLUSIVE MODE;
    SELECT b.lo, b.hi INTO week
      FROM pg_inherits AS h CROSS JOIN LATERAL history_partition_bounds(h.inhrelid) AS b
     WHERE h.inhrelid = p_week AND h.inhparent = 'notification'::regclass;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF EXISTS (SELECT 1 FROM notification_queue AS q
                WHERE q.id >= week.lo AND q.id < week.hi
                  AND q.status IN ('PENDING', 'PROCESSING')) THEN
        RETURN false;
    END IF;
    DELETE FROM notification_queue AS q WHERE q.id >= week.lo AND q.id < week.hi;
    EXECUTE format('DROP TABLE %s', p_week);
    RETURN true;
END $function$;
