-- What /status and /metrics read. Each query is bounded by the queue table (the backlog and
-- what operators keep, no SENT row) or by planner statistics, never by the size of the
-- notification table: delivered rows outnumber waiting ones by orders of magnitude and are
-- never counted row by row.

-- name: database_ping
SELECT 1;

-- name: queue_depth
-- Exact counts for the statuses an operator acts on, by priority, from notification_queue
-- (which holds no SENT row): PENDING, FAILED and DEAD_LETTERED from queue_status (status,
-- created_at, id) INCLUDE (channel, priority), index-only once vacuum has set the visibility
-- map; PROCESSING (at most workers x batch rows) from queue_claim_expiry.
SELECT status, priority, count(*) AS count
  FROM notification_queue
 WHERE status IN ('PENDING', 'FAILED', 'DEAD_LETTERED')
 GROUP BY status, priority
UNION ALL
SELECT 'PROCESSING', priority, count(*)
  FROM notification_queue
 WHERE status = 'PROCESSING'
 GROUP BY priority;

-- name: final_status_estimates
-- SENT, CANCELLED, SUPPRESSED, EXPIRED and DIGESTED are estimated, not counted: the planner's row estimate for
-- the table (pg_class.reltuples) times each status's share in pg_stats (kept by ANALYZE and
-- autovacuum). A status too rare to be among the most common values has no row here.
SELECT s.status, greatest(0, round(s.freq * c.reltuples))::bigint AS count
  FROM pg_class AS c
 CROSS JOIN LATERAL (
        SELECT unnest(st.most_common_vals::text::text[]) AS status,
               unnest(st.most_common_freqs) AS freq
          FROM pg_stats AS st
         WHERE st.schemaname = current_schema()
           AND st.tablename = 'notification'
           AND st.attname = 'status'
       ) AS s
 WHERE c.oid = 'notification'::regclass
   AND s.status IN ('SENT', 'CANCELLED', 'SUPPRESSED', 'EXPIRED', 'DIGESTED');

-- name: pending_oldest_due
-- The longest-due PENDING row: one probe of notification_queue's queue_pending_due per
-- priority (as the worker's next wake-up), stopping at the first row that is due.
SELECT min(head.due_at)
  FROM (VALUES (0), (1), (2), (3)) AS p(priority)
 CROSS JOIN LATERAL (
        SELECT due_at
          FROM notification_queue
         WHERE status = 'PENDING' AND priority = p.priority AND due_at <= %(now)s
         ORDER BY due_at
         LIMIT 1
       ) AS head;

-- name: held_by_reason
-- PENDING rows held past their own time, by the reason the API shows (held_reason_of: a rate
-- limit's mark first, then a circuit's, then quiet hours'). Each count reads the partial index
-- that holds only rows with that mark (notification_rate_held, notification_circuit_held,
-- notification_quiet_held), so its cost is the held rows', not the backlog's or the history's.
SELECT 'rate_limit' AS reason, count(*) AS count
  FROM notification
 WHERE rate_deferred_from IS NOT NULL AND status = 'PENDING'
UNION ALL
SELECT 'circuit_open', count(*)
  FROM notification
 WHERE circuit_held_since IS NOT NULL AND rate_deferred_from IS NULL AND status = 'PENDING'
UNION ALL
SELECT 'quiet_hours', count(*)
  FROM notification
 WHERE quiet_held_since IS NOT NULL AND circuit_held_since IS NULL
   AND rate_deferred_from IS NULL AND status = 'PENDING';

-- name: webhook_backlog
-- Each count reads one partial index of webhook_queue, the events not yet final
-- (webhook_queue_due, webhook_queue_claim_expiry).
SELECT 'PENDING' AS state, count(*) AS count FROM webhook_queue WHERE state = 'PENDING'
UNION ALL
SELECT 'DELIVERING', count(*) FROM webhook_queue WHERE state = 'DELIVERING';

-- name: webhook_oldest_due
SELECT min(next_attempt_at)
  FROM webhook_queue
 WHERE state = 'PENDING' AND next_attempt_at <= %(now)s;

-- name: workers_live
-- The workers not dead by the one definition the takeover of claims uses (worker_dead: not
-- stopped, and a heartbeat within %(dead_after_s)s seconds by the database's clock).
-- worker_heartbeat has one row per worker process ever started: small.
SELECT count(*) AS live, max(last_seen_at) AS last_seen_at
  FROM worker_heartbeat
 WHERE NOT worker_dead(worker_id, %(dead_after_s)s::float8);

-- name: circuits_all
-- Every provider's circuit breaker (a handful of rows, one per channel and provider).
SELECT name, state, consecutive_failures, opened_at FROM circuit_breaker ORDER BY name;
