-- A slot of this key (ratelimit_key: channel, client, recipient) is free: the next row a deferral holds back (rate_deferred_from) becomes due
-- now. It moves notifications, so it is this app's, not ratelimits'.
CREATE OR REPLACE FUNCTION ratelimit_release_next(p_channel text, p_client uuid, p_recipient text, p_except uuid)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
DECLARE
    held uuid;
BEGIN
    -- Look first, update only what was found: an UPDATE opens every index of the table even
    -- when it changes nothing, and most keys have no held row.
    SELECT w.id INTO held
    FROM notification AS w
    WHERE md5(w.recipient)::uuid = md5(p_recipient)::uuid AND w.recipient = p_recipient
      -- The key's own rows: a window is per (channel, client, recipient). A row spelling the
      -- recipient differently (another case) shares the window but is not found here; it goes
      -- at its scheduled slot.
      AND w.channel = p_channel AND w.client_id = p_client
      AND w.status = 'PENDING' AND w.rate_deferred_from IS NOT NULL
      AND w.due_at > notifyqueue_now() AND w.id <> p_except
    -- The next slot's row: the deferrals give the slots out in claim order, so the earliest
    -- due is the first in line, found at the start of the key's entries of
    -- notification_rate_held, whatever the number held.
    ORDER BY md5(w.recipient)::uuid, w.client_id, w.channel, w.due_at
    LIMIT 1;
    IF held IS NOT NULL THEN
        UPDATE notification AS n
        SET due_at = greatest(n.rate_deferred_from, notifyqueue_now()),
            rate_deferred_from = NULL,
            updated_at = notifyqueue_now()
        WHERE n.id = held AND n.status = 'PENDING' AND n.rate_deferred_from IS NOT NULL;
    END IF;
END $function$;
