-- The API's writes to the notification table. Each statement is one round trip and decides
-- its race inside PostgreSQL: the unique constraint for creates, the status guard for cancels.
-- They run through the SQL gateway (notifyqueue/sqlgateway.py), which fills dataclasses by
-- column name: a statement that answers notifications names NotificationRecord's columns (the
-- table also holds the worker's claim columns, which that record does not carry). The two
-- statements of the thin create path (notification_create_checked, notifications_create_many)
-- are read by position instead (notifications/repositories.py, docs/performance.md).

-- name: notification_create
-- One round trip for a create: the insert, or, when the client already used the key, the row
-- that holds it (`created` tells which). The unique constraint (client_id, idempotency_key)
-- decides between concurrent creates: the loser waits for the winner's commit and inserts
-- nothing. The existing row is read with the statement's snapshot, taken before that wait, so
-- a winner that committed meanwhile is not seen: the statement then returns no row and the
-- caller runs it again (a fresh snapshot). Times come from the database clock: `send_at` is
-- when the client asked for (a past time means now), `delay_seconds` counts from now.
WITH clock AS (
    SELECT notifyqueue_now() AS now
), new AS (
    INSERT INTO notification (
        id, client_id, idempotency_key, request_fingerprint,
        channel, recipient, subject, body, priority, metadata,
        user_id, template, payload, fallback_channels,
        status, send_at, due_at, attempt_count, max_attempts, operator_retries,
        created_at, updated_at, expires_at, cancellation_key
    )
    SELECT notifyqueue_uuid7(), %(client_id)s, %(idempotency_key)s, %(request_fingerprint)s,
           %(channel)s, %(recipient)s, %(subject)s, %(body)s, %(priority)s, %(metadata)s::jsonb,
           %(user_id)s, %(template)s, %(payload)s::jsonb, %(fallback_channels)s::jsonb,
           'PENDING', due.at, due.at, 0, %(max_attempts)s, 0,
           clock.now, clock.now,
           CASE WHEN %(ttl_seconds)s::integer IS NOT NULL
                  THEN due.at + make_interval(secs => %(ttl_seconds)s::integer)
                ELSE %(expires_at)s::timestamptz END,
           %(cancellation_key)s
      FROM clock
     CROSS JOIN LATERAL (
        SELECT CASE
                 WHEN %(delay_seconds)s::integer IS NOT NULL
                   THEN clock.now + make_interval(secs => %(delay_seconds)s::integer)
                 ELSE GREATEST(coalesce(%(send_at)s::timestamptz, clock.now), clock.now)
               END AS at
     ) AS due
    ON CONFLICT DO NOTHING
    RETURNING *
)
-- NotificationRecord's columns, by name (the gateway fills its fields from them).
SELECT true AS created,
       new.id, new.client_id, new.idempotency_key, new.request_fingerprint, new.status,
       new.channel, new.recipient, new.subject, new.body, new.priority, new.metadata,
       new.user_id, new.template, new.payload, new.fallback_channels, new.send_at, new.due_at,
       new.attempt_count, new.max_attempts, new.last_error, new.sent_at, new.operator_retries,
       new.created_at, new.updated_at, new.last_retried_at, new.last_retried_by,
       new.expires_at, new.cancellation_key
  FROM new
UNION ALL
SELECT false AS created,
       n.id, n.client_id, n.idempotency_key, n.request_fingerprint, n.status, n.channel,
       n.recipient, n.subject, n.body, n.priority, n.metadata, n.user_id, n.template,
       n.payload, n.fallback_channels, n.send_at, n.due_at, n.attempt_count, n.max_attempts,
       n.last_error, n.sent_at, n.operator_retries, n.created_at, n.updated_at,
       n.last_retried_at, n.last_retried_by, n.expires_at, n.cancellation_key
  FROM notification AS n
 WHERE n.client_id = %(client_id)s
   AND n.idempotency_key = %(idempotency_key)s
   AND NOT EXISTS (SELECT 1 FROM new);

-- name: notifications_create_many
-- A batch in one statement: every item (keys already distinct) is inserted, or the row that
-- already holds its key is returned (`created` false), in no particular order. The items
-- arrive as one JSON array; the wake-up trigger is per statement, so the whole batch sends
-- one NOTIFY. As in notification_create, a key committed by another request while this
-- statement waited is missing from the answer; the caller runs the statement again for those.
-- A row it inserted answers what the database chose (its id and times) and its JSON values as
-- stored (jsonb rewrites numbers and key order; an empty metadata object or fallback list comes
-- back NULL); its other columns are NULL: the caller has them, as it sent them. Decoding every
-- column of every new row back was a quarter of a batch's CPU in the API.
WITH clock AS (
    SELECT notifyqueue_now() AS now
), item AS (
    SELECT *
      FROM jsonb_to_recordset(%(items)s::jsonb) AS i(
           idempotency_key text, request_fingerprint text,
           channel text, recipient text, subject text, body text, priority smallint,
           metadata jsonb, user_id text, template text, payload jsonb,
           fallback_channels jsonb, send_at timestamptz, delay_seconds integer,
           max_attempts integer, expires_at timestamptz, ttl_seconds integer,
           cancellation_key text)
), new AS (
    INSERT INTO notification (
        id, client_id, idempotency_key, request_fingerprint,
        channel, recipient, subject, body, priority, metadata,
        user_id, template, payload, fallback_channels,
        status, send_at, due_at, attempt_count, max_attempts, operator_retries,
        created_at, updated_at, expires_at, cancellation_key
    )
    SELECT notifyqueue_uuid7(), %(client_id)s, i.idempotency_key, i.request_fingerprint,
           i.channel, i.recipient, i.subject, i.body, i.priority, i.metadata,
           i.user_id, i.template, i.payload, i.fallback_channels,
           'PENDING', due.at, due.at, 0, i.max_attempts, 0,
           clock.now, clock.now,
           CASE WHEN i.ttl_seconds IS NOT NULL
                  THEN due.at + make_interval(secs => i.ttl_seconds)
                ELSE i.expires_at END,
           i.cancellation_key
      FROM item AS i
     CROSS JOIN clock
     CROSS JOIN LATERAL (
        SELECT CASE
                 WHEN i.delay_seconds IS NOT NULL
                   THEN clock.now + make_interval(secs => i.delay_seconds)
                 ELSE GREATEST(coalesce(i.send_at, clock.now), clock.now)
               END AS at
     ) AS due
     -- Keys are locked in one order whatever the items' order, so two batches that meet on
     -- the same keys wait for each other instead of deadlocking.
     ORDER BY i.idempotency_key
    ON CONFLICT DO NOTHING
    RETURNING id, idempotency_key, metadata, payload, fallback_channels, send_at, due_at,
              created_at, updated_at, expires_at
)
-- NotificationRecord's columns, in its order (read by position).
SELECT true AS created,
       new.id, NULL AS client_id, new.idempotency_key, NULL AS request_fingerprint,
       NULL AS status, NULL AS channel, NULL AS recipient, NULL AS subject, NULL AS body,
       NULL AS priority, nullif(new.metadata, '{}'::jsonb) AS metadata, NULL AS user_id,
       NULL AS template, new.payload,
       nullif(new.fallback_channels, '[]'::jsonb) AS fallback_channels, new.send_at,
       new.due_at, NULL AS attempt_count,
       NULL AS max_attempts, NULL AS last_error, NULL AS sent_at, NULL AS operator_retries,
       new.created_at, new.updated_at, NULL AS last_retried_at, NULL AS last_retried_by,
       new.expires_at, NULL AS cancellation_key
  FROM new
UNION ALL
SELECT false AS created,
       n.id, n.client_id, n.idempotency_key, n.request_fingerprint, n.status,
       n.channel, n.recipient, n.subject, n.body, n.priority, n.metadata,
       n.user_id, n.template, n.payload, n.fallback_channels, n.send_at, n.due_at,
       n.attempt_count, n.max_attempts, n.last_error, n.sent_at, n.operator_retries,
       n.created_at, n.updated_at, n.last_retried_at, n.last_retried_by,
       n.expires_at, n.cancellation_key
  FROM item AS i
 -- One look-up by the unique (client_id, idempotency_key) index per item (LIMIT keeps the
 -- planner from turning it into a join, which read every row of the client: a cost that
 -- grew with its backlog).
 CROSS JOIN LATERAL (
    SELECT *
      FROM notification AS held
     WHERE held.client_id = %(client_id)s
       AND held.idempotency_key = i.idempotency_key
     LIMIT 1
 ) AS n
 WHERE NOT EXISTS (SELECT 1 FROM new WHERE new.idempotency_key = i.idempotency_key);

-- name: notification_by_key
SELECT id, client_id, idempotency_key, request_fingerprint, status, channel, recipient,
       subject, body, priority, metadata, user_id, template, payload, fallback_channels,
       send_at, due_at, attempt_count, max_attempts, last_error, sent_at, operator_retries,
       created_at, updated_at, last_retried_at, last_retried_by, rate_deferred_from,
       circuit_held_since, quiet_held_since, receipt, expires_at, cancellation_key,
       digest_bucket_id, digest_closes_at, digest_id
  FROM notification
 WHERE client_id = %(client_id)s AND idempotency_key = %(idempotency_key)s;

-- name: notifications_by_keys
SELECT * FROM notification
 WHERE client_id = %(client_id)s AND idempotency_key = ANY(%(keys)s::text[]);

-- name: notification_by_id
-- With a client, only that client's row (another client's id reads as missing).
SELECT id, client_id, idempotency_key, request_fingerprint, status, channel, recipient,
       subject, body, priority, metadata, user_id, template, payload, fallback_channels,
       send_at, due_at, attempt_count, max_attempts, last_error, sent_at, operator_retries,
       created_at, updated_at, last_retried_at, last_retried_by, rate_deferred_from,
       circuit_held_since, quiet_held_since, receipt, expires_at, cancellation_key,
       digest_bucket_id, digest_closes_at, digest_id
  FROM notification
 WHERE id = %(id)s
   AND (%(client_id)s::uuid IS NULL OR client_id = %(client_id)s::uuid);

-- name: notification_cancel
-- Only a PENDING row changes. A worker's claim takes the same row lock and also requires
-- PENDING, so exactly one of the two wins; the other sees zero rows. A row a rate-limit
-- deferral held back is held no longer: it leaves notification_rate_held, whose rows each
-- admission of the recipient would otherwise find and look through for ever (and a row quiet
-- hours held leaves notification_quiet_held).
UPDATE notification
   SET status = 'CANCELLED', rate_deferred_from = NULL, quiet_held_since = NULL,
       updated_at = %(now)s
 WHERE id = %(id)s
   AND client_id = %(client_id)s
   AND status = 'PENDING'
RETURNING id, client_id, idempotency_key, request_fingerprint, status, channel, recipient,
          subject, body, priority, metadata, user_id, template, payload, fallback_channels,
          send_at, due_at, attempt_count, max_attempts, last_error, sent_at, operator_retries,
          created_at, updated_at, last_retried_at, last_retried_by, expires_at,
          cancellation_key, digest_bucket_id, digest_closes_at, digest_id;

-- name: notifications_cancel_by_key
-- One batch of a cancel by key (delivery/sql/functions/notifications_cancel_by_key.sql, the
-- worker's app's: it ends claims too): how many rows it cancelled, and whether candidates were
-- left (past the batch, or locked by a worker's statement at that moment).
SELECT cancelled, remaining
  FROM notifications_cancel_by_key(%(client_id)s, %(cancellation_key)s, %(limit)s);

-- name: database_now
-- The database clock, which decides send times and expiries.
SELECT notifyqueue_now();

-- name: client_pending_count
-- Counts at most `limit` rows, so the cost is bounded by the limit, not by the backlog: the
-- function (notifications/sql/functions/) walks the client's entries in notification_queue's
-- queue_client_status (client_id, status, created_at DESC, id DESC) in the index's order and
-- stops at the limit, with sequential and bitmap scans off, so a queue a burst has left large
-- and nearly empty is not read whole.
SELECT notification_client_pending_count(%(client_id)s, %(limit)s);

-- name: notification_retry
-- An operator sends one FAILED or DEAD_LETTERED row back to the queue with a fresh set of
-- attempts, due now. The status guard makes this safe against a second operator (or a
-- double click): only the first UPDATE finds the row in a retryable status. last_error is
-- kept so the history stays readable; a circuit hold it ended on is forgotten (its maximum
-- hold counts afresh); the wake-up trigger NOTIFYs idle workers. Due now by
-- the database's clock (the operator's `now` only stamps the record of who retried when).
UPDATE notification
   SET status = 'PENDING',
       due_at = notifyqueue_now(),
       attempt_count = 0,
       circuit_held_since = NULL,
       operator_retries = operator_retries + 1,
       last_retried_at = %(now)s,
       last_retried_by = %(operator)s,
       updated_at = %(now)s
 WHERE id = %(id)s
   AND status IN ('FAILED', 'DEAD_LETTERED')
RETURNING id, client_id, idempotency_key, request_fingerprint, status, channel, recipient,
          subject, body, priority, metadata, user_id, template, payload, fallback_channels,
          send_at, due_at, attempt_count, max_attempts, last_error, sent_at, operator_retries,
          created_at, updated_at, last_retried_at, last_retried_by, expires_at,
          cancellation_key;

-- name: notifications_retry_oldest
-- The bulk retry: up to %(limit)s rows in one status (optionally one channel), oldest first,
-- read from notification_queue's queue_status (status, created_at, id) index. SKIP LOCKED
-- gives two operators retrying at once disjoint rows, so none is retried twice by one round;
-- the UPDATE re-checks the status it expects. `retried_before` (optional) leaves out rows an
-- operator retried at or after that time, so a long-running command never picks up a row it
-- already sent back and that failed again meanwhile.
WITH chosen AS (
    SELECT n.id
      FROM notification_queue AS q
      JOIN notification AS n ON n.id = q.id
     WHERE q.status = %(status)s
       AND (%(channel)s::varchar IS NULL OR q.channel = %(channel)s::varchar)
       AND (%(retried_before)s::timestamptz IS NULL
            OR n.last_retried_at IS NULL
            OR n.last_retried_at < %(retried_before)s::timestamptz)
     ORDER BY q.created_at, q.id
     LIMIT %(limit)s
       FOR UPDATE OF n SKIP LOCKED
)
UPDATE notification AS n
   SET status = 'PENDING',
       due_at = notifyqueue_now(),
       attempt_count = 0,
       circuit_held_since = NULL,
       operator_retries = n.operator_retries + 1,
       last_retried_at = %(now)s,
       last_retried_by = %(operator)s,
       updated_at = %(now)s
  FROM chosen
 WHERE n.id = chosen.id
   AND n.status = %(status)s
RETURNING n.id, n.client_id, n.channel, n.operator_retries;

-- name: notifications_retryable_count
-- What a bulk retry would still find: the same conditions as notifications_retry_oldest,
-- counted from the same index.
SELECT count(*)
  FROM notification_queue AS q
  JOIN notification AS n ON n.id = q.id
 WHERE q.status = %(status)s
   AND (%(channel)s::varchar IS NULL OR q.channel = %(channel)s::varchar)
   AND (%(retried_before)s::timestamptz IS NULL
        OR n.last_retried_at IS NULL
        OR n.last_retried_at < %(retried_before)s::timestamptz);

-- name: notification_create_checked
-- A create with its API key checked by the same statement: the thin create path
-- (notifications/ingest.py) sends it for a key this process has authenticated before. The
-- function (notifications/sql/functions/) inserts the row only while the key with this prefix
-- and hash is still the client's, unrevoked and unexpired (database clock); a key the client
-- already used inserts nothing either. Either way nothing is returned and the caller goes the
-- long way (the key looked up on its own, then notification_create, which answers a replay).
-- A function, so that PostgreSQL plans the insert once per server connection instead of on
-- every create (0.3 ms, docs/performance.md). Answers only what the database chose or
-- rewrote (notifications/repositories.py, `_CHOSEN_COLUMNS`): the row's id
-- and times, and its JSON values as stored (an empty metadata object or fallback list NULL);
-- the caller has the rest, as it sent them.
SELECT *
  FROM notification_create_checked(
       %(client_id)s, %(idempotency_key)s, %(request_fingerprint)s, %(channel)s,
       %(recipient)s, %(subject)s, %(body)s, %(priority)s, %(metadata)s::jsonb,
       %(user_id)s, %(template)s, %(payload)s::jsonb, %(fallback_channels)s::jsonb,
       %(delay_seconds)s::integer, %(send_at)s::timestamptz, %(max_attempts)s,
       %(key_prefix)s, %(hashed_key)s, %(expires_at)s::timestamptz, %(ttl_seconds)s::integer,
       %(cancellation_key)s);

-- name: notifications_create_checked_many
-- Several single creates, gathered while another create statement of this process ran
-- (notifications/repositories.py, `CreateCombiner`), each with its API key checked as
-- notification_create_checked checks it (notifications/sql/functions/). Each row answers its
-- client and key, then `_CHOSEN_COLUMNS`; an item that inserted nothing answers nothing.
SELECT * FROM notifications_create_checked_many(%(items)s::jsonb);

-- name: notification_digest_create
-- A create with a digest key (notifications/sql/functions/notification_digest_create.sql).
SELECT created, notification_id
  FROM notification_digest_create(
    %(client_id)s, %(idempotency_key)s, %(request_fingerprint)s, %(channel)s, %(recipient)s,
    %(subject)s, %(body)s, %(priority)s, %(metadata)s::jsonb, %(user_id)s, %(template)s,
    %(payload)s::jsonb, %(fallback_channels)s::jsonb, %(max_attempts)s,
    %(expires_at)s::timestamptz, %(ttl_seconds)s::integer, %(cancellation_key)s,
    %(digest_key)s, %(digest_window_seconds)s::integer, %(digest_at)s);
