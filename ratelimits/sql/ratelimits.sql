-- The rolling windows. `RateLimitRepository` is the only user of these statements.
-- A window is keyed by ratelimit_key(channel, client, recipient key) (ratelimits/sql/functions/):
-- one per client and recipient on every channel, the recipient in its counting form
-- (notifyqueue/addresses.py); with the ceiling on, also ratelimit_key(channel, NULL, recipient
-- key) per address across clients. Everything that checks a key's count runs under that key's
-- transaction-level advisory lock (taken inside ratelimit_admit()), so two workers never both
-- take the last slot; other keys hash to other locks and are not blocked. Every time is
-- notifyqueue_now(), the database's clock.

-- name: ratelimit_admit
-- Lock, forget what left the window, count, and record if under the limit and the ceiling
-- (CRITICAL: record without a check); when a slot is left over, let the next held row of the key go. The
-- function is in notifications/sql/functions/. True when admitted.
SELECT ratelimit_admit(%(channel)s, %(client_id)s, %(recipient)s, %(notification_id)s,
                       %(claim_token)s, %(limit)s, %(window_s)s, %(critical)s,
                       %(recipient_key)s, %(ceiling)s)

-- name: ratelimit_admit_many
-- ratelimit_admit for every row of a claim, in one statement: the keys' advisory locks are
-- taken in one global order (notifications/sql/functions/ratelimit_admit_many.sql), so concurrent callers cannot deadlock.
-- Returns each row's id and whether it was admitted.
SELECT notification_id, admitted
FROM ratelimit_admit_many(%(channels)s::text[], %(client_ids)s::uuid[], %(recipients)s::text[],
                          %(ids)s::uuid[], %(claim_tokens)s::uuid[], %(criticals)s::boolean[],
                          %(limit)s, %(window_s)s, %(recipient_keys)s::text[], %(ceiling)s)

-- name: ratelimit_defer
-- The key is at its limit. Gives the claimed row back (PENDING, attempt returned), due at the
-- moment its slot frees, and schedules the key's whole backlog the same way, so each waiting
-- row becomes due exactly when a slot is free for it instead of being claimed and deferred
-- again every time any slot frees.
-- The statement is delivery's function (delivery/sql/functions/notification_rate_defer.sql):
-- it ends the claim and moves notifications, tables above this app's.
SELECT due_at
FROM notification_rate_defer(%(channel)s::text, %(client_id)s::uuid, %(recipient)s::text,
                             %(notification_id)s::uuid, %(claim_token)s::uuid, %(limit)s::int,
                             %(window_s)s::float8, %(recipient_key)s::text, %(ceiling)s::int)

-- name: ratelimit_release_freed
-- Failed attempts freed their slots: for each such key, the next row a deferral holds back may
-- go now (notifications/sql/functions/ratelimit_release_freed.sql, which reads and moves the
-- held notifications).
SELECT ratelimit_release_freed(%(channels)s::text[], %(client_ids)s::uuid[],
                               %(recipients)s::text[], %(ids)s::uuid[])

-- name: ratelimit_prune
-- Forgets deliveries that have left every window, a bounded number at a time.
DELETE FROM ratelimit_delivery
WHERE claim_token IN (
    SELECT claim_token FROM ratelimit_delivery
    WHERE at <= notifyqueue_now() - make_interval(secs => %(window_s)s)
    LIMIT %(limit)s
)
