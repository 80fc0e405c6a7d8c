-- The close of digest buckets (notifications/digests.py): each statement calls one of the
-- functions under notifications/sql/functions/, or reads a bucket's rows through
-- notification_digest_items (its rows in id order), so every cost is the bucket's, never the
-- history's.

-- name: notification_digests_claim
SELECT id, client_id, digest_key, channel, recipient, user_id, template, closes_at, collected,
       digest_id, claim_token
  FROM notification_digests_claim(%(worker)s, %(limit)s, %(claim_s)s, %(dead_after_s)s);

-- name: notification_digest_collect
SELECT held, last_id, scanned, digested
  FROM notification_digest_collect(%(bucket)s, %(token)s, %(after)s, %(limit)s, %(claim_s)s);

-- name: notification_digest_count
SELECT count(*) FROM notification AS n
 WHERE n.digest_bucket_id = %(bucket)s AND n.status = 'DIGESTED';

-- name: notification_digest_items
SELECT n.id, n.subject, n.body, n.payload, n.priority, n.fallback_channels
  FROM notification AS n
 WHERE n.digest_bucket_id = %(bucket)s AND n.status = 'DIGESTED'
 ORDER BY n.id
 LIMIT %(limit)s;

-- name: notification_digest_newest
-- The bucket's newest row carried: its payload fills the digest's other slots, its priority and
-- fallbacks are the digest's.
SELECT n.id, n.subject, n.body, n.payload, n.priority, n.fallback_channels
  FROM notification AS n
 WHERE n.digest_bucket_id = %(bucket)s AND n.status = 'DIGESTED'
 ORDER BY n.id DESC
 LIMIT 1;

-- name: notification_digest_finish
SELECT finished, digest_id
  FROM notification_digest_finish(%(bucket)s, %(token)s, %(digested)s, %(subject)s, %(body)s,
                                  %(priority)s, %(payload)s::jsonb, %(metadata)s::jsonb,
                                  %(fallback_channels)s::jsonb, %(max_attempts)s);

-- name: notification_digests_open
-- Buckets not yet CLOSED, the soonest to close first (/metrics, queue_status).
SELECT id, client_id, digest_key, channel, state, collected, closes_at
  FROM notification_digest
 WHERE state = 'OPEN'
 ORDER BY closes_at
 LIMIT %(limit)s;
