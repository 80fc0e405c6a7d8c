-- The receipts app's SQL: signed provider events recorded once, matched to the SENT attempt
-- they name (on their own channel), and pruned when they can no longer match.

-- name: provider_event_accept
-- A signed event's id, once per channel: no row back means a replay.
INSERT INTO provider_event_seen (channel, event_id, received_at)
VALUES (%(channel)s, %(event_id)s, notifyqueue_now())
ON CONFLICT ON CONSTRAINT provider_event_once DO NOTHING
RETURNING id;

-- name: receipt_add
-- A receipt, unless the same (channel, message id, type, bounce) was recorded before
-- (receipt_once): no row back means a duplicate, which changes nothing.
INSERT INTO delivery_receipt (id, channel, message_id, type, bounce, occurred_at, received_at,
                     event_id)
VALUES (gen_random_uuid(), %(channel)s, %(message_id)s, %(type)s, %(bounce)s,
        %(occurred_at)s, notifyqueue_now(), %(event_id)s)
ON CONFLICT DO NOTHING
RETURNING id;

-- name: receipts_match_messages
-- Applies the pending receipts of these (channel, message id) pairs whose SENT attempt is
-- now recorded: each is tied to that attempt's notification, once (a receipt another
-- transaction is applying is skipped: that one applies it). Index probes only: the pending
-- receipts by digest (receipt_pending), the attempts by digest (attempt_by_message_id); the
-- full ids are compared too, so two ids with one digest never match each other.
WITH keys AS (
    SELECT DISTINCT k.channel, k.message_id
    FROM unnest(%(channels)s::text[], %(message_ids)s::text[]) AS k(channel, message_id)
), pending AS (
    SELECT r.id, r.channel, r.message_id
    FROM keys AS k
    JOIN delivery_receipt AS r
      ON md5(r.message_id)::uuid = md5(k.message_id)::uuid
     AND r.channel = k.channel AND r.message_id = k.message_id
    WHERE r.notification_id IS NULL
    FOR UPDATE OF r SKIP LOCKED
), matched AS (
    SELECT DISTINCT ON (p.id) p.id AS receipt_id, a.notification_id
    FROM pending AS p
    JOIN delivery_attempt AS a
      ON md5(a.provider_message_id)::uuid = md5(p.message_id)::uuid
     AND a.provider_message_id = p.message_id
     AND a.channel = p.channel
     AND a.outcome = 'SENT'
    ORDER BY p.id, a.started_at DESC
)
UPDATE delivery_receipt AS r
SET notification_id = m.notification_id, client_id = n.client_id,
    applied_at = notifyqueue_now()
FROM matched AS m
JOIN notification AS n ON n.id = m.notification_id
JOIN clients_client AS c ON c.id = n.client_id
WHERE r.id = m.receipt_id
RETURNING r.id, r.channel, r.message_id, r.type, r.bounce, r.occurred_at, r.received_at,
          r.notification_id, n.client_id, n.recipient, n.status, n.attempt_count,
          c.webhook_url <> '' AS hooked;

-- name: receipts_match_ids
-- The same for pending receipts named by id (the upkeep's sweep).
WITH pending AS (
    SELECT r.id, r.channel, r.message_id
    FROM delivery_receipt AS r
    WHERE r.id = ANY (%(ids)s::uuid[]) AND r.notification_id IS NULL
    FOR UPDATE OF r SKIP LOCKED
), matched AS (
    SELECT DISTINCT ON (p.id) p.id AS receipt_id, a.notification_id
    FROM pending AS p
    JOIN delivery_attempt AS a
      ON md5(a.provider_message_id)::uuid = md5(p.message_id)::uuid
     AND a.provider_message_id = p.message_id
     AND a.channel = p.channel
     AND a.outcome = 'SENT'
    ORDER BY p.id, a.started_at DESC
)
UPDATE delivery_receipt AS r
SET notification_id = m.notification_id, client_id = n.client_id,
    applied_at = notifyqueue_now()
FROM matched AS m
JOIN notification AS n ON n.id = m.notification_id
JOIN clients_client AS c ON c.id = n.client_id
WHERE r.id = m.receipt_id
RETURNING r.id, r.channel, r.message_id, r.type, r.bounce, r.occurred_at, r.received_at,
          r.notification_id, n.client_id, n.recipient, n.status, n.attempt_count,
          c.webhook_url <> '' AS hooked;

-- name: receipts_pending_page
-- The sweep's next page of pending receipts, oldest first after its position
-- (receipt_pending_age).
SELECT id, received_at
FROM delivery_receipt
WHERE notification_id IS NULL
  AND (%(after_received_at)s::timestamptz IS NULL
       OR (received_at, id) > (%(after_received_at)s::timestamptz, %(after_id)s::uuid))
ORDER BY received_at, id
LIMIT %(limit)s;

-- name: notification_receipt_set
-- Each notification's latest receipt type, unless it already has a bounce or a complaint,
-- which stay.
UPDATE notification AS n
SET receipt = r.type
FROM unnest(%(ids)s::uuid[], %(types)s::text[]) AS r(id, type)
WHERE n.id = r.id
  AND (n.receipt IS NULL OR n.receipt NOT IN ('bounced', 'complained'))
  AND n.receipt IS DISTINCT FROM r.type;

-- name: notification_visible
SELECT EXISTS (SELECT FROM notification
               WHERE id = %(notification_id)s
                 AND (%(client_id)s::uuid IS NULL OR client_id = %(client_id)s::uuid));

-- name: receipts_of_notification
-- A notification's applied receipts, oldest first (receipt_by_notification), for its owner
-- (any client when client_id is null); at most `limit` (one per type and bounce kind exist).
SELECT r.type, r.bounce, r.message_id, r.channel, r.occurred_at, r.received_at
FROM delivery_receipt AS r
WHERE r.notification_id = %(notification_id)s
  AND (%(client_id)s::uuid IS NULL OR r.client_id = %(client_id)s::uuid)
ORDER BY r.received_at, r.id
LIMIT %(limit)s;

-- name: receipts_pending_prune
-- Pending receipts older than the pending lifetime can no longer be told from noise.
DELETE FROM delivery_receipt
WHERE id IN (SELECT id FROM delivery_receipt
             WHERE notification_id IS NULL
               AND received_at < notifyqueue_now() - make_interval(secs => %(age_s)s)
             ORDER BY received_at
             LIMIT %(limit)s);

-- name: provider_events_seen_prune
DELETE FROM provider_event_seen
WHERE id IN (SELECT id FROM provider_event_seen
             WHERE received_at < notifyqueue_now() - make_interval(secs => %(age_s)s)
             ORDER BY received_at
             LIMIT %(limit)s);
