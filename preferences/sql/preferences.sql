-- The preferences app's SQL: users' preferences and the in-app inbox (its table is written
-- by the delivery worker's finish statement; this app reads it and marks messages read).

-- name: preferences_upsert
-- A PUT replaces the whole document in one statement; `xmax = 0` tells a create from a
-- replacement. A new time zone or new quiet hours re-time the user's held notifications in
-- this statement (the trigger user_preferences_quiet_hours_changed, the notifications app's).
INSERT INTO user_preferences AS p (id, client_id, user_id, channels, addresses, muted_events,
                                   disabled_channels, timezone, quiet_hours, created_at,
                                   updated_at)
VALUES (gen_random_uuid(), %(client_id)s, %(user_id)s, %(channels)s::jsonb,
        %(addresses)s::jsonb, %(muted_events)s::jsonb, %(disabled_channels)s::jsonb,
        %(timezone)s, %(quiet_hours)s::jsonb, %(now)s, %(now)s)
ON CONFLICT ON CONSTRAINT user_preferences_client_user DO UPDATE
SET channels = excluded.channels, addresses = excluded.addresses,
    muted_events = excluded.muted_events, disabled_channels = excluded.disabled_channels,
    timezone = excluded.timezone, quiet_hours = excluded.quiet_hours,
    updated_at = excluded.updated_at
RETURNING p.client_id, p.user_id, p.channels, p.addresses, p.muted_events, p.disabled_channels,
          p.created_at, p.updated_at, p.timezone, p.quiet_hours, (p.xmax = 0) AS created;

-- name: preferences_read_many
-- The preferences of each (client, user) pair given, in one statement for a worker's whole
-- claim: one probe of user_preferences_client_user per pair, however many users have
-- preferences. Pairs with none are left out.
SELECT p.client_id, p.user_id, p.channels, p.addresses, p.muted_events, p.disabled_channels,
       p.created_at, p.updated_at, p.timezone, p.quiet_hours
  FROM unnest(%(client_ids)s::uuid[], %(user_ids)s::text[]) AS k(client_id, user_id)
  JOIN user_preferences p ON p.client_id = k.client_id AND p.user_id = k.user_id;

-- name: timezone_names
-- The zones PostgreSQL's time zone database knows (a view that reads its files, ~15 ms).
SELECT name FROM pg_timezone_names;

-- name: preferences_event_mute
-- One-click unsubscribe: adds the event to the user's muted events, unless it is there (so a
-- second click changes nothing); one statement, so a concurrent PUT is wholly before or after.
UPDATE user_preferences
SET muted_events = muted_events || jsonb_build_array(%(event)s::text), updated_at = %(now)s
WHERE client_id = %(client_id)s AND user_id = %(user_id)s
  AND NOT (muted_events ? %(event)s::text)
RETURNING user_id;

-- name: inbox_page
-- Newest first, by keyset on (created_at, id) after the cursor's position; served by the
-- index inbox_by_user (client_id, user_id, created_at DESC). Reads limit + 1 rows to tell
-- whether another page follows.
SELECT id, notification_id, subject, body, metadata, created_at, read_at
FROM inbox_message
WHERE client_id = %(client_id)s
  AND user_id = %(user_id)s
  AND (NOT %(unread_only)s OR read_at IS NULL)
  AND (%(after_created_at)s::timestamptz IS NULL
       OR (created_at, id) < (%(after_created_at)s::timestamptz, %(after_id)s::uuid))
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s + 1;

-- name: inbox_message_read
-- Idempotent: a message read twice keeps the time it was first read. Scoped to the client
-- and the user, so another client's message id matches nothing (404).
UPDATE inbox_message
   SET read_at = coalesce(read_at, %(now)s)
 WHERE id = %(id)s AND client_id = %(client_id)s AND user_id = %(user_id)s
RETURNING id, notification_id, subject, body, metadata, created_at, read_at;
