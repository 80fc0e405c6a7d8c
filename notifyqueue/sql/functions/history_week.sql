-- The start of the history week holding `at`: Monday 00:00 UTC. The history tables
-- (notification, delivery_attempt, webhook_event, webhook_delivery_attempt) are partitioned by
-- week of creation, read from the ids (history_partition_add); retention drops whole weeks.
CREATE OR REPLACE FUNCTION history_week(at timestamp with time zone)
 RETURNS timestamp with time zone
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
    SELECT date_bin('7 days', at, '2001-01-01 00:00:00+00')
$function$;
