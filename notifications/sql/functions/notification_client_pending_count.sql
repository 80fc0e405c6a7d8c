-- Counts at most p_limit of a client's PENDING rows, walking queue_client_status in its order;
-- sequential and bitmap scans are off so a queue a burst left large and nearly empty is not
-- read whole.
CREATE OR REPLACE FUNCTION notification_client_pending_count(p_client_id uuid, p_limit integer)
 RETURNS bigint
 LANGUAGE plpgsql
 STABLE
 SET enable_seqscan TO 'off'
 SET enable_bitmapscan TO 'off'
 SET plan_cache_mode TO 'force_custom_plan'
AS $function$
BEGIN
    RETURN (
        SELECT count(*) FROM (
            SELECT 1
              FROM notification_queue
             WHERE client_id = p_client_id
               AND status = 'PENDING'
             ORDER BY created_at DESC, id DESC
             LIMIT p_limit
        ) AS pending
    );
END
$function$;
