-- The rolling windows. `RateLimitRepository` is the only user of these statements.
-- A window is keyed by ratelimit_key(channel, client, recipient key) (ratelimits/sql/functions/):
-- one per client and recipient on every channel, the recipient in its counting form
-- (notifyqueue/addresses.py); with the ceiling on, also ratelimit_key(channel, NULL, recipient
-- key) per address across clients. Everything that checks a key's count runs under that key's
-- transaction-level advisory lock (taken inside ratelimit_admit_many()), so two workers never both
-- take the last slot; other keys hash to other locks and are not blocked. Every time is
-- notifyqueue_now(), the database's clock.

-- name: ratelimit_admit_many
-- Lock, forget what left the window, count, and record if under the limit and the ceiling
-- (CRITICAL: record without a check); when a slot is left over, let the next held row of the
-- key go. For every row of a claim, in one statement: the keys' advisory locks are
-- taken in one global order (notifications/sql/functions/ratelimit_admit_many.sql), so concurrent callers cannot deadlock.
-- Returns each row's id and whether it was admitted.
SELECT notification_id, admitted
FROM ratelimit_admit_many(%(channels)s::text[], %(client_ids)s::uuid[], %(recipients)s::text[],
                          %(ids)s::uuid[], %(claim_tokens)s::uuid[], %(criticals)s::boolean[],
                          %(limit)s, %(window_s)s, %(recipient_keys)s::text[], %(ceiling)s)

-- name: ratelimit_defer_many
-- The claims still over their keys' limits after the admission checked them again, under the
-- locks that check took (the caller's transaction holds them until this is written): each is
-- given back (PENDING, attempt returned), due when a slot frees for it. One statement for all
-- the keys; for each key it moves a bounded number of rows whatever its backlog: the claimed
-- ones and its rows among the first `ahead` due rows of the client's pairs, into the free
-- slots after the last one an earlier deferral handed out.
-- The statement is delivery's function (delivery/sql/functions/notification_rate_defer_many.sql):
-- it ends the claims and moves notifications, tables above this app's.
SELECT notification_id, due_at
FROM notification_rate_defer_many(%(channels)s::text[], %(client_ids)s::uuid[],
                                  %(recipients)s::text[], %(recipient_keys)s::text[],
                                  %(ids)s::uuid[], %(claim_tokens)s::uuid[], %(limit)s::int,
                                  %(window_s)s::float8, %(ceiling)s::int, %(ahead)s::int)

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
