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
    -- The next slot's row: the deferrals give the slots out in claim order, so the key's
    -- earliest held row is the first in line, found by a walk of the key's waiting rows by due
    -- time (queue_pending_recipient) from now, whatever the number held.
    -- Each queue row's record is checked by a subquery, not a join: a join could start from
    -- the record's held rows and read all of them.
    SELECT q.id INTO held
    FROM notification_queue AS q
    WHERE q.status = 'PENDING' AND q.recipient_digest = md5(p_recipient)::uuid
      -- The key's own rows: a window is per (channel, client, recipient). A row spelling the
      -- recipient differently (another case) shares the window but is not found here; it goes
      -- at its scheduled slot.
      AND q.client_id = p_client AND q.channel = p_channel AND q.due_at > notifyqueue_now()
      AND q.id <> p_except
      AND (SELECT w.rate_deferred_from IS NOT NULL AND w.recipient = p_recipient
           FROM notification AS w WHERE w.id = q.id)
    ORDER BY q.recipient_digest, q.client_id, q.channel, q.due_at
    LIMIT 1;
    IF held IS NOT NULL THEN
        UPDATE notification AS n
        SET due_at = greatest(n.rate_deferred_from, notifyqueue_now()),
            rate_deferred_from = NULL,
            updated_at = notifyqueue_now()
        WHERE n.id = held AND n.status = 'PENDING' AND n.rate_deferred_from IS NOT NULL;
    END IF;
END $function$;
