-- Retention: a finished notification goes with every row that refers to it, in each app's
-- tables, so these statements are the highest app's. `RetentionRepository` is their only user.

-- name: notifications_prune_cutoff
-- Retention is measured on the database clock, once per run, so every batch agrees.
SELECT notifyqueue_now() - make_interval(secs => %(older_than_s)s);

-- name: notifications_prune_batch
-- One step of retention: walks up to %(scan)s rows created before the cutoff, in (created_at,
-- id) order from %(after_created_at)s/%(after_id)s (the notification_recent index, read
-- backwards), and deletes those that finished before the cutoff, with every row that refers
-- to them: delivery attempts and receipts, webhook events and their delivery attempts, inbox messages,
-- rate-limit records and the simulated provider's records of its sends (keyed
-- `<id>:<channel>`, one per channel in %(channels)s, found by primary key). A row still waiting (scheduled far ahead) stays, and so does one whose
-- webhook is still being delivered. Rows another transaction holds (an operator retry) are
-- skipped, not waited for. One statement: the locks last as long as this batch's deletes.
-- tests/integration/test_prune_notifications.py checks that every foreign key to these tables is covered.
WITH scanned AS (
    SELECT id, created_at
      FROM notification
     WHERE (created_at, id) > (%(after_created_at)s, %(after_id)s)
       AND created_at < %(cutoff)s
     ORDER BY created_at, id
     LIMIT %(scan)s
), chosen AS (
    SELECT n.id
      FROM notification AS n
      JOIN scanned USING (id)
     WHERE n.status IN ('SENT', 'FAILED', 'DEAD_LETTERED', 'CANCELLED', 'SUPPRESSED',
                        'EXPIRED', 'DIGESTED')
       AND n.updated_at < %(cutoff)s
       AND NOT EXISTS (
           SELECT 1
             FROM webhook_event AS e
            WHERE e.notification_id = n.id
              AND e.state IN ('PENDING', 'DELIVERING'))
       FOR UPDATE OF n SKIP LOCKED
), events AS (
    SELECT e.id FROM webhook_event AS e JOIN chosen ON e.notification_id = chosen.id
), webhook_attempts_gone AS (
    DELETE FROM webhook_delivery_attempt WHERE event_id IN (SELECT id FROM events)
), events_gone AS (
    DELETE FROM webhook_event WHERE id IN (SELECT id FROM events)
), attempts_gone AS (
    DELETE FROM delivery_attempt WHERE notification_id IN (SELECT id FROM chosen) RETURNING 1
), receipts_gone AS (
    DELETE FROM delivery_receipt WHERE notification_id IN (SELECT id FROM chosen)
), inbox_gone AS (
    DELETE FROM inbox_message WHERE notification_id IN (SELECT id FROM chosen)
), rate_records_gone AS (
    DELETE FROM ratelimit_delivery WHERE notification_id IN (SELECT id FROM chosen)
), simulated_gone AS (
    DELETE FROM simulated_provider_message
     WHERE idempotency_key IN (
           SELECT chosen.id::text || ':' || channel
             FROM chosen CROSS JOIN unnest(%(channels)s::text[]) AS channel)
), gone AS (
    DELETE FROM notification WHERE id IN (SELECT id FROM chosen) RETURNING 1
), last AS (
    SELECT created_at, id FROM scanned ORDER BY created_at DESC, id DESC LIMIT 1
)
SELECT (SELECT count(*) FROM scanned) AS scanned,
       (SELECT count(*) FROM gone) AS deleted,
       (SELECT count(*) FROM attempts_gone) AS attempts_deleted,
       (SELECT created_at FROM last) AS last_created_at,
       (SELECT id FROM last) AS last_id;

-- name: digests_prune_batch
-- One step of retention for digest buckets: deletes up to %(limit)s buckets closed before the
-- cutoff, oldest first, through notification_digest_closed. Nothing refers to a bucket by key
-- (a collected notification keeps the bucket's id as a plain value), and an open or closing
-- bucket is never touched.
DELETE FROM notification_digest
 WHERE id IN (SELECT id FROM notification_digest
               WHERE state = 'CLOSED' AND closed_at < %(cutoff)s
               ORDER BY closed_at
               LIMIT %(limit)s
                 FOR UPDATE SKIP LOCKED);
