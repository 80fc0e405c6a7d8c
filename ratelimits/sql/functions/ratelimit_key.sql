-- A window's key: `<channel>:<client>:<recipient key>` for the per-(client, recipient) limit, or
-- `<channel>:*:<recipient key>` (p_client NULL) for the service-wide ceiling per address. The
-- recipient key is the recipient's counting form (notifyqueue/addresses.py). The channel is
-- one of four names and the client a UUID's fixed 36 characters (never `*`), so what comes
-- before the recipient cannot be forged by a recipient's spelling: a push token written
-- `in_app:<client>:<user>` is still push's. Hashed, so an index entry is bounded.
CREATE OR REPLACE FUNCTION ratelimit_key(p_channel text, p_client uuid, p_recipient_key text)
 RETURNS bytea
 LANGUAGE sql
 STABLE PARALLEL SAFE
AS $function$
    SELECT sha256(convert_to(
        p_channel || ':' || coalesce(p_client::text, '*') || ':' || p_recipient_key, 'UTF8'))
$function$;
