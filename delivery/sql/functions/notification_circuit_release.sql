-- A circuit closed (its probe succeeded): the rows it held on this channel are due now rather
-- than at the probe time they were given. Only held rows that are still PENDING and not yet
-- due move; found through notification_circuit_held, so the cost is the held rows'.
CREATE OR REPLACE FUNCTION notification_circuit_release(p_channel text)
 RETURNS integer
 LANGUAGE plpgsql
AS $function$
DECLARE
    released integer;
BEGIN
    UPDATE notification AS n
    SET due_at = notifyqueue_now(), updated_at = notifyqueue_now()
    WHERE n.circuit_held_since IS NOT NULL AND n.channel = p_channel
      AND n.status = 'PENDING' AND n.due_at > notifyqueue_now();
    GET DIAGNOSTICS released = ROW_COUNT;
    RETURN released;
END $function$;
