-- ratelimit_admit_many for one row.
CREATE OR REPLACE FUNCTION ratelimit_admit(p_channel text, p_client uuid, p_recipient text, p_notification uuid, p_claim uuid, p_limit integer, p_window_s double precision, p_critical boolean, p_recipient_key text DEFAULT NULL::text, p_ceiling integer DEFAULT 0)
 RETURNS boolean
 LANGUAGE sql
AS $function$
    SELECT admitted
    FROM ratelimit_admit_many(ARRAY[p_channel], ARRAY[p_client], ARRAY[p_recipient],
                              ARRAY[p_notification], ARRAY[p_claim], ARRAY[p_critical],
                              p_limit, p_window_s, ARRAY[coalesce(p_recipient_key, p_recipient)],
                              p_ceiling)
$function$;
