-- Retention: a finished notification goes with every row that refers to it, in each app's
-- tables, so these statements are the highest app's. `RetentionRepository` is their only user.

-- name: notifications_prune_cutoff
-- Retention is measured on the database clock, once per run, so every batch agrees.
SELECT notifyqueue_now() - make_interval(secs => %(older_than_s)s);

-- name: history_weeks_before
-- The weeks of `notification` (history_partition_add) that ended by the cutoff, oldest first:
-- each partition's name and its id range, [lo, hi). Read from the catalog.
SELECT h.inhrelid::regclass::text AS name, b.lo, b.hi
  FROM pg_inherits AS h
 CROSS JOIN LATERAL history_partition_bounds(h.inhrelid) AS b
 WHERE h.inhparent = 'notification'::regclass
   AND b.hi <= notifyqueue_uuid7_floor(%(cutoff)s)
 ORDER BY b.lo;

-- name: history_week_held
-- Whether a week must stay: a row of it still waiting or in flight (scheduled far ahead,
-- held, or retried by an operator), or one whose webhook is still being delivered. Reads the
-- queue tables (the backlog and the webhook backlog), never the week's finished rows.
SELECT EXISTS (SELECT 1 FROM notification_queue AS q
                WHERE q.id >= %(lo)s AND q.id < %(hi)s AND q.status IN ('PENDING', 'PROCESSING'))
    OR EXISTS (SELECT 1 FROM webhook_queue AS w JOIN webhook_event AS e ON e.id = w.id
                WHERE e.notification_id >= %(lo)s AND e.notification_id < %(hi)s);

-- name: history_week_prune_batch
-- One step of a week's retention, before its partition is dropped (notification_week_drop):
-- of the week's next %(scan)s notifications after %(after)s, in id order (the week's primary
-- key), deletes every row of another table that refers to them (notifications_history_delete),
-- and the queue copies of those that can never change again (CANCELLED, SUPPRESSED,
-- EXPIRED, DIGESTED; an operator may still retry a FAILED or DEAD_LETTERED one, whose copy the
-- drop deletes under its lock). The notifications themselves go with the partition.
WITH chosen AS (
    SELECT n.id, n.status
      FROM notification AS n
     WHERE n.id > %(after)s AND n.id >= %(lo)s AND n.id < %(hi)s
     ORDER BY n.id
     LIMIT %(scan)s
), history_gone AS (
    SELECT notifications_history_delete(array(SELECT id FROM chosen), %(channels)s::text[])
           AS attempts
), copies_gone AS (
    DELETE FROM notification_queue
     WHERE id IN (SELECT id FROM chosen
                   WHERE status IN ('CANCELLED', 'SUPPRESSED', 'EXPIRED', 'DIGESTED'))
)
SELECT count(*) AS scanned,
       (SELECT attempts FROM history_gone) AS attempts_deleted,
       max(id::text)::uuid AS last_id
  FROM chosen;

-- name: notification_week_drop
SELECT notification_week_drop(%(name)s::regclass);

-- name: notifications_prune_batch
-- One step of retention for the rows outside every week, in the default partition
-- (notification_default: rows made before the table was partitioned, or with ids that are no
-- UUIDv7): walks up to %(scan)s rows created before the cutoff, in (created_at,
-- id) order from %(after_created_at)s/%(after_id)s (the partition's notification_recent index,
-- read backwards), and deletes those that finished before the cutoff, with every row that refers
-- to them (notifications_history_delete, one per channel in %(channels)s). A row still waiting
-- (scheduled far ahead) stays, and so does one whose webhook is still being delivered. Rows
-- another transaction holds (an operator retry) are skipped, not waited for. One statement:
-- the locks last as long as this batch's deletes.
WITH scanned AS (
    SELECT id, created_at
      FROM notification_default
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
), history_gone AS (
    SELECT notifications_history_delete(array(SELECT id FROM chosen), %(channels)s::text[])
           AS attempts
), gone AS (
    DELETE FROM notification WHERE id IN (SELECT id FROM chosen) RETURNING 1
), last AS (
    SELECT created_at, id FROM scanned ORDER BY created_at DESC, id DESC LIMIT 1
)
SELECT (SELECT count(*) FROM scanned) AS scanned,
       (SELECT count(*) FROM gone) AS deleted,
       (SELECT attempts FROM history_gone) AS attempts_deleted,
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
