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
