-- The API's writes to the notification table. Each statement is one round trip and decides
-- its race inside PostgreSQL: the unique constraint for creates, the status guard for cancels.

-- name: notification_insert
-- The unique constraint (client_id, idempotency_key) decides between concurrent creates: the
-- loser waits for the winner's commit, then inserts nothing and gets no row back.
INSERT INTO notification (
    id, client_id, idempotency_key, request_fingerprint,
    channel, recipient, subject, body, priority, metadata,
    user_id, template, payload, fallback_channels,
    status, send_at, due_at, attempt_count, max_attempts, operator_retries,
    created_at, updated_at
) VALUES (
    %(id)s, %(client_id)s, %(idempotency_key)s, %(request_fingerprint)s,
    %(channel)s, %(recipient)s, %(subject)s, %(body)s, %(priority)s, %(metadata)s::jsonb,
    %(user_id)s, %(template)s, %(payload)s::jsonb, %(fallback_channels)s::jsonb,
    'PENDING', %(send_at)s, %(due_at)s, 0, %(max_attempts)s, 0,
    %(now)s, %(now)s
)
ON CONFLICT ON CONSTRAINT notification_client_idempotency_key DO NOTHING
RETURNING *;

-- name: notification_cancel
-- Only a PENDING row changes. A worker's claim takes the same row lock and also requires
-- PENDING, so exactly one of the two wins; the other sees zero rows.
UPDATE notification
   SET status = 'CANCELLED', updated_at = %(now)s
 WHERE id = %(id)s
   AND client_id = %(client_id)s
   AND status = 'PENDING'
RETURNING *;

-- name: client_pending_count
-- Counts at most `limit` rows, so the cost is bounded by the limit, not by the backlog.
-- Served by the partial index notification_client_pending (client_id) WHERE PENDING.
SELECT count(*) FROM (
    SELECT 1
      FROM notification
     WHERE client_id = %(client_id)s
       AND status = 'PENDING'
     LIMIT %(limit)s
) AS pending;

-- name: notification_retry
-- An operator sends one FAILED or DEAD_LETTERED row back to the queue with a fresh set of
-- attempts, due now. The status guard makes this safe against a second operator (or a
-- double click): only the first UPDATE finds the row in a retryable status. last_error is
-- kept so the history stays readable; the wake-up trigger NOTIFYs idle workers.
UPDATE notification
   SET status = 'PENDING',
       due_at = %(now)s,
       attempt_count = 0,
       operator_retries = operator_retries + 1,
       last_retried_at = %(now)s,
       last_retried_by = %(operator)s,
       updated_at = %(now)s
 WHERE id = %(id)s
   AND status IN ('FAILED', 'DEAD_LETTERED')
RETURNING *;

-- name: notifications_retry_oldest
-- The bulk retry: up to %(limit)s rows in one status (optionally one channel), oldest first,
-- read from the partial index notification_operator_queue (status, created_at, id). SKIP
-- LOCKED gives two operators retrying at once disjoint rows, so none is retried twice by one
-- round; the UPDATE re-checks the status it expects. `retried_before` (optional) leaves out
-- rows an operator retried at or after that time, so a long-running command never picks up
-- a row it already sent back and that failed again meanwhile.
WITH chosen AS (
    SELECT id
      FROM notification
     WHERE status = %(status)s
       AND (%(channel)s::varchar IS NULL OR channel = %(channel)s::varchar)
       AND (%(retried_before)s::timestamptz IS NULL
            OR last_retried_at IS NULL
            OR last_retried_at < %(retried_before)s::timestamptz)
     ORDER BY created_at, id
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
UPDATE notification AS n
   SET status = 'PENDING',
       due_at = %(now)s,
       attempt_count = 0,
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
-- counted on the same partial index (an index-only scan once the visibility map is set).
SELECT count(*)
  FROM notification
 WHERE status = %(status)s
   AND (%(channel)s::varchar IS NULL OR channel = %(channel)s::varchar)
   AND (%(retried_before)s::timestamptz IS NULL
        OR last_retried_at IS NULL
        OR last_retried_at < %(retried_before)s::timestamptz);
