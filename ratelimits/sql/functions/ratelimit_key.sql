-- The window's key: the address for email, SMS and push (across clients: it protects the
-- person), the (client, user) for in-app; hashed, so an index entry is bounded.
CREATE OR REPLACE FUNCTION ratelimit_key(p_channel text, p_client uuid, p_recipient text)
 RETURNS bytea
 LANGUAGE sql
 STABLE PARALLEL SAFE
AS $function$
    SELECT sha256(convert_to(
        CASE WHEN p_channel = 'in_app' THEN 'in_app:' || p_client || ':' || p_recipient
             ELSE p_recipient END, 'UTF8'))
$function$;
