-- The delivery worker's SQL. `DeliveryRepository` is the only user of these statements.
-- Every statement that ends a claim names the claim token and expects status PROCESSING, so a
-- worker whose claim was taken over changes nothing. Every time comes from notifyqueue_now(),
-- the database's clock: a worker's own clock never decides what is due or expired.

-- name: notification_claim_due
-- Takes up to %(limit)s due rows in claim order, skipping rows other workers hold, and marks
-- them PROCESSING under a fresh claim token. The attempt is counted here, at claim time, so a
-- message that crashes its worker still runs out of attempts. Commits before any provider call.
--
-- Claim order: every due CRITICAL first (whoever's); then the clients with due rows take
-- turns, the one the claims served longest ago first, however large each claim is: each
-- client's first row, then each client's second, ... Each client's own rows go in priority
-- order, then by due time; a NORMAL or LOW row moves up one level (never above HIGH) for each
-- %(aging_s)s seconds it has waited past its due time (0: it never moves). So neither one
-- client's backlog nor its priorities hold another client's rows behind it. No client takes
-- more than its share of one claim, ceil(limit / clients with a due row), while others wait.
-- A client's turns and share count the claims this worker already holds for it
-- (%(held_clients)s, %(held_counts)s: running or waiting for a send slot), so a client that
-- holds every slot waits until the others hold as many.
--
-- The statement is a PL/pgSQL function (delivery/sql/functions/) so that its plan is made
-- once per server connection, not on every call: planning was most of a claim of a row or
-- two. The cost grows with the number of clients that have waiting rows, not with the rows
-- or the history.
SELECT id, claim_token, client_id, channel, recipient, subject, body, metadata, priority,
       attempt_count, max_attempts, user_id, template, payload, fallback_channels,
       expires_in_s, cancellable
FROM notification_claim_due_many(%(limit)s, %(worker)s, %(claim_timeout_s)s, %(aging_s)s,
                                  %(held_clients)s::uuid[], %(held_counts)s::integer[]);

-- name: notification_send_start
-- The last check before the provider is called, for the claims that carry an expiry or a
-- cancellation key (the others need none), in one statement for a step's sends. A row still
-- PROCESSING under its claim and not past its expiry (database clock) is marked started and
-- answers `started`; one past its expiry answers `expired` (the worker ends it EXPIRED, not
-- sent); a row that answers nothing was cancelled meanwhile (or its claim taken over), and is
-- not sent. A cancel by key takes a claimed row only while it is not marked started, and both
-- lock the record: whichever comes first decides, so a send starts either before the cancel
-- (and finishes as it would have) or never. Each row is locked for this statement only.
WITH claim AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(tokens)s::uuid[]) AS c(id, claim_token)
), started AS (
    UPDATE notification AS n
    SET send_started_at = notifyqueue_now()
    FROM claim AS c
    WHERE n.id = c.id AND n.claim_token = c.claim_token AND n.status = 'PROCESSING'
      AND (n.expires_at IS NULL OR n.expires_at > notifyqueue_now())
    RETURNING n.id
)
SELECT id, 'started' AS state FROM started
UNION ALL
SELECT n.id, 'expired' AS state
FROM claim AS c
JOIN notification AS n ON n.id = c.id
WHERE n.claim_token = c.claim_token AND n.status = 'PROCESSING'
  AND n.expires_at <= notifyqueue_now()
  AND n.id NOT IN (SELECT id FROM started);

-- name: history_partitions_add
-- The partitions of this week and the %(weeks_ahead)s after it that are missing, added
-- (history_partition_add); answers their names.
SELECT added
  FROM generate_series(0, %(weeks_ahead)s) AS week
 CROSS JOIN LATERAL history_partition_add('notification', 'id',
                                          notifyqueue_now() + week * interval '7 days',
                                          'client_id, idempotency_key') AS added
 WHERE added IS NOT NULL;

-- name: notifications_expire
-- The worker's upkeep (delivery/upkeep.py, `ExpiryFinisher`): up to %(limit)s waiting rows
-- past their expiry by the database clock end EXPIRED, whatever held them (a schedule, a
-- retry's backoff, a rate-limit deferral, an open circuit, ...), earliest expiry first. Read
-- through queue_pending_expiry, whose entries are the waiting rows with an expiry, so the
-- cost is the rows that expired, not the backlog. SKIP LOCKED: a row a claim or a cancel holds
-- is theirs (the claim's expiry stage ends it); the record's own state is re-checked on the
-- locked version. A row whose earlier send started and never reported back (its claim
-- expired) is left to be sent again under its idempotency key: that send began in time. The
-- webhook event comes from the outbox trigger.
WITH chosen AS (
    SELECT n.id
    FROM notification_queue AS q
    JOIN notification AS n ON n.id = q.id
    WHERE q.status = 'PENDING' AND q.expires_at IS NOT NULL
      AND q.expires_at <= notifyqueue_now()
      AND n.send_started_at IS NULL
    ORDER BY q.expires_at
    LIMIT %(limit)s
    FOR UPDATE OF n SKIP LOCKED
)
UPDATE notification AS n
SET status = 'EXPIRED',
    last_error = 'expired: not sent by ' || to_char(n.expires_at AT TIME ZONE 'UTC',
                                                    'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
    rate_deferred_from = NULL,
    circuit_held_since = NULL,
    quiet_held_since = NULL,
    updated_at = notifyqueue_now()
FROM chosen
WHERE n.id = chosen.id AND n.status = 'PENDING' AND n.expires_at <= notifyqueue_now()
  AND n.send_started_at IS NULL
RETURNING n.id, n.client_id, n.channel::varchar AS channel;

-- name: notification_finish
-- Applies a batch of results (delivery/sql/functions/notification_finish_many.sql): each result
-- applies only to a PROCESSING row still held under the claim token it carries (a claim that
-- expired and was taken over is left alone); its attempt is finished; a result other than
-- SENT frees the rate-limit slot it was admitted to; an in-app delivery reaches the inbox in
-- the same transaction; final statuses get their webhook event from the trigger on
-- notification (webhooks/sql/functions/notification_webhook_outbox.sql). A fallback switch (channel and content non-null,
-- attempt_reset true) moves the row to its next channel with its attempts reset; the finished
-- attempt keeps the old channel. A retry or deferral carries its wait in seconds (delay_s),
-- added to the database's clock; NULL keeps the row's due time. Each changed row is answered
-- with whether its slot was freed (the caller then lets the next held row of that recipient
-- go: ratelimit_release_freed). A function, so that PostgreSQL plans the statement once per
-- server connection instead of on every batch (docs/decisions/0003-kept-plans-in-plpgsql-functions.md).
SELECT id, status, channel, client_id, recipient, freed_slot
FROM notification_finish_many(
    %(ids)s::uuid[], %(tokens)s::uuid[], %(statuses)s::text[], %(outcomes)s::text[],
    %(errors)s::text[], %(message_ids)s::text[], %(delays)s::float8[],
    %(attempt_deltas)s::int[], %(attempt_resets)s::boolean[], %(channels)s::text[],
    %(recipients)s::text[], %(subjects)s::text[], %(bodies)s::text[], %(fallbacks)s::text[]);

-- name: notification_circuit_hold
-- Claims refused by their provider's open circuit (delivery/sql/functions/
-- notification_circuit_hold_many.sql): each goes back PENDING, its attempt returned, due at its
-- circuit's probe time, or is DEAD_LETTERED once held past the maximum hold; guarded by its
-- claim token like the finish. Each changed row is answered with whether its rate-limit slot
-- was freed, and, when held, until when.
SELECT id, status, channel, client_id, recipient, freed_slot, held_until
FROM notification_circuit_hold_many(
    %(ids)s::uuid[], %(tokens)s::uuid[], %(circuits)s::text[], %(cooldown_s)s::float8,
    %(max_hold_s)s::float8);

-- name: notification_quiet_hold
-- Claims for users whose quiet hours hold them now (delivery/sql/functions/
-- notification_quiet_hold_many.sql): each goes back PENDING, its attempt returned, due at the
-- end of its window by the user's time zone; the others go on. Answers the held rows.
SELECT id, held_until
FROM notification_quiet_hold_many(%(ids)s::uuid[], %(tokens)s::uuid[], %(channels)s::text[]);

-- name: notification_circuit_release
-- A circuit closed: its channel's held rows are due now (notification_circuit_release.sql).
SELECT notification_circuit_release(%(channel)s::text);

-- name: notification_finish_unrecordable
-- A result the finish statement could not write even on its own: the row still ends, as
-- DEAD_LETTERED with the reason, so it neither waits for its claim to expire nor goes back to
-- a provider that may already have accepted it. An operator can retry it.
WITH ended AS (
    UPDATE notification AS n
    SET status = 'DEAD_LETTERED',
        last_error = %(reason)s,
        claim_token = NULL,
        claim_expires_at = NULL,
        updated_at = notifyqueue_now()
    WHERE n.id = %(id)s AND n.claim_token = %(token)s AND n.status = 'PROCESSING'
    RETURNING n.id, n.status, n.channel, n.client_id, n.recipient
), attempt AS (
    UPDATE delivery_attempt
    SET finished_at = notifyqueue_now(), outcome = 'ABANDONED', error = %(reason)s
    WHERE claim_token = %(token)s AND EXISTS (SELECT 1 FROM ended)
)
-- freed_slot is false: this statement leaves the attempt's rate-limit slot counted.
SELECT id, status, channel, client_id, recipient, false AS freed_slot FROM ended;

-- name: notification_reclaim_expired
-- Takes claims away from workers that can no longer finish them, and returns their rows to
-- PENDING, due now; each row says why (`cause`):
-- - dead_worker: its worker is dead (worker_dead: stopped, or no heartbeat for
--   %(dead_after_s)s seconds by the database's clock; NULL skips this test). Found through
--   queue_claimed_by: `holders` walks the distinct workers holding claims by skipping through
--   that index (one probe a worker), each is judged by its heartbeat row (a primary-key
--   look-up), and only a dead one's claims are read. So the cost grows with the workers
--   holding claims and the dead ones' claims, never with the backlog or the history.
-- - claim_timeout: the claim is past its expiry (claim_expires_at, the hard timeout: a live
--   worker starts no provider call that could end after it), whatever its worker's heartbeat
--   says; found in queue_claim_expiry.
-- The attempt the worker used stays counted. When that was already the final attempt the row
-- still gets one more claim (attempt_count may reach max_attempts + 1): the message may have
-- been delivered, and re-sending with the same idempotency key confirms it. A row that crashed
-- on that extra attempt too is dead-lettered. The abandoned claim's rate-limit slot is freed:
-- the re-send is admitted (and counted) again, so one delivery never counts twice. The worker
-- that lost the claim changes nothing afterwards: every finish names the claim token.
WITH RECURSIVE holders AS (
    (SELECT q.claimed_by FROM notification_queue AS q
     WHERE q.status = 'PROCESSING' AND q.claimed_by IS NOT NULL
       AND %(dead_after_s)s::float8 IS NOT NULL
     ORDER BY q.claimed_by
     LIMIT 1)
    UNION ALL
    SELECT (SELECT q.claimed_by FROM notification_queue AS q
            WHERE q.status = 'PROCESSING' AND q.claimed_by > h.claimed_by
            ORDER BY q.claimed_by
            LIMIT 1)
    FROM holders AS h
    WHERE h.claimed_by IS NOT NULL
), dead_claims AS (
    SELECT q.id, 'dead_worker' AS cause
    FROM holders AS h
    CROSS JOIN LATERAL (
        SELECT q.id FROM notification_queue AS q
        WHERE q.status = 'PROCESSING' AND q.claimed_by = h.claimed_by
        LIMIT %(limit)s
    ) AS q
    WHERE h.claimed_by IS NOT NULL AND worker_dead(h.claimed_by, %(dead_after_s)s::float8)
    LIMIT %(limit)s
), timed_out AS (
    SELECT q.id, 'claim_timeout' AS cause
    FROM notification_queue AS q
    WHERE q.status = 'PROCESSING' AND q.claim_expires_at < notifyqueue_now()
    ORDER BY q.claim_expires_at
    LIMIT %(limit)s
), found AS (
    -- A dead worker's claim that also timed out counts as the worker's death.
    SELECT DISTINCT ON (c.id) c.id, c.cause
    FROM (SELECT * FROM dead_claims UNION ALL SELECT * FROM timed_out) AS c
    ORDER BY c.id, c.cause = 'dead_worker' DESC
), expired AS (
    SELECT n.id, n.claim_token, n.claimed_by, f.cause
    FROM found AS f
    JOIN notification AS n ON n.id = f.id
    WHERE n.status = 'PROCESSING'
    LIMIT %(limit)s
    FOR UPDATE OF n SKIP LOCKED
), reclaimed AS (
    UPDATE notification AS n
    SET status = CASE WHEN n.attempt_count > n.max_attempts THEN 'DEAD_LETTERED' ELSE 'PENDING' END,
        last_error = CASE e.cause
            WHEN 'dead_worker' THEN 'claim taken over: worker ' || e.claimed_by || ' is dead'
            ELSE 'claim expired: worker ' || e.claimed_by || ' did not report back'
        END,
        due_at = notifyqueue_now(),
        claim_token = NULL,
        claim_expires_at = NULL,
        updated_at = notifyqueue_now()
    FROM expired AS e
    -- The record's own state, re-checked on the version locked above (see the claim): the
    -- same claim, still held, and (timed out) still past its expiry.
    WHERE n.id = e.id AND n.status = 'PROCESSING' AND n.claim_token = e.claim_token
      AND (e.cause = 'dead_worker' OR n.claim_expires_at < notifyqueue_now())
    RETURNING n.id, n.status, e.claim_token, e.cause
), attempt AS (
    UPDATE delivery_attempt AS a
    SET finished_at = notifyqueue_now(), outcome = 'ABANDONED',
        error = CASE r.cause WHEN 'dead_worker' THEN 'worker dead' ELSE 'claim expired' END
    FROM reclaimed AS r
    WHERE a.claim_token = r.claim_token
), unslotted AS (
    DELETE FROM ratelimit_delivery AS d
    USING reclaimed AS r
    WHERE d.claim_token = r.claim_token
)
SELECT id, status, cause FROM reclaimed;

-- name: notification_next_due_in
-- Seconds until the earliest waiting row is due (negative: overdue; NULL: nothing waits), by
-- the database's clock: one probe of queue_pending_due per priority.
SELECT extract(epoch FROM min(head.due_at) - notifyqueue_now())::float8
FROM (VALUES (0), (1), (2), (3)) AS p(priority)
CROSS JOIN LATERAL (
    SELECT due_at
    FROM notification_queue
    WHERE status = 'PENDING' AND priority = p.priority
    ORDER BY due_at
    LIMIT 1
) AS head;

-- name: statistics_refresh_lock
-- One worker at a time refreshes the statistics; the others skip (released at commit).
SELECT pg_try_advisory_xact_lock(hashtext('notifyqueue:statistics_refresh'));

-- name: statistics_stale_tables
-- The hot tables whose planner statistics lag behind a burst: more rows inserted, updated or
-- deleted since their last ANALYZE than %(changes)s and than %(fraction)s of the table.
-- Autoanalyze waits for 10 %% of the table and a launcher cycle (a minute); a burst of rows due
-- at once is past before that, and until then the planner thinks the claim indexes hold one
-- row and may pick plans that read the whole backlog on every claim. The fraction keeps a
-- large table from being sampled (up to 30,000 pages) at every heartbeat of a long drain.
-- Those counters reach pg_stat_user_tables up to a second after the commit that made them, so a
-- burst's first claims come before they show it: the queue is stale too when the planner's row
-- count for it (pg_class.reltuples; -1 until first analyzed, when it reads the table's size
-- instead) is below %(queue_rows)s, the rows a claim just took from it.
SELECT s.relname::text
FROM pg_stat_user_tables AS s
JOIN pg_class AS c ON c.oid = s.relid
WHERE s.relname = ANY(%(tables)s::text[])
  AND (s.n_mod_since_analyze > greatest(%(changes)s, %(fraction)s * s.n_live_tup)
       OR (s.relname = 'notification_queue' AND c.reltuples >= 0
           AND c.reltuples < %(queue_rows)s))
ORDER BY s.relname;

-- name: statistics_sample_small
-- For the rest of the refresh's transaction, ANALYZE samples 3,000 rows (300 x this target)
-- instead of 30,000. The plans the hot path needs tell an empty table from a full one and a
-- few keys from many, which 3,000 rows show; the full sample of delivery_attempt and
-- ratelimit_delivery, which grow with the history and the rate window, held the worker's loop
-- 100-240 ms at 250,000 rows, every second or two of a drain. Autovacuum's own ANALYZE still takes the full sample.
SET LOCAL default_statistics_target = 10;

-- The refresh's ANALYZEs skip a table whose lock another holds: autovacuum holds the same lock
-- (SHARE UPDATE EXCLUSIVE) while it works on a table, for seconds on a large one, and an
-- ANALYZE waiting for it held the worker's loop until autovacuum was cancelled, a deadlock
-- timeout (1 s) later: one latency repeat had p99 737 ms. Skipped, the table is refreshed at a later check, or by autovacuum's own ANALYZE.

-- name: analyze_notification_queue
ANALYZE (SKIP_LOCKED) notification_queue;

-- name: analyze_ratelimit_delivery
ANALYZE (SKIP_LOCKED) ratelimit_delivery;

-- name: analyze_delivery_attempt
ANALYZE (SKIP_LOCKED) delivery_attempt;

-- name: queue_dead_and_live
-- Each queue table's dead and live rows, as the statistics count them (each backend's counts
-- reach them within a second of its commits). A finished row leaves its queue, deleted; its
-- index entries stay until VACUUM removes them, and the claims step over every one: after a
-- drain of 40,000 rows a claim of one visited 470 pages of queue_pending_client, 4 once
-- vacuumed; after 20,000 webhook deliveries the
-- sender's claim of one event visited 923 pages of webhook_queue, 17 once vacuumed.
SELECT t.name AS table, pg_stat_get_dead_tuples(t.name::regclass) AS dead,
       pg_stat_get_live_tuples(t.name::regclass) AS live
FROM unnest(%(tables)s::text[]) AS t(name);

-- name: vacuum_notification_queue
-- Never waits: while autovacuum (or another worker) vacuums the queue, this does nothing.
VACUUM (SKIP_LOCKED) notification_queue;

-- name: vacuum_webhook_queue
VACUUM (SKIP_LOCKED) webhook_queue;

-- name: worker_heartbeat_upsert
-- The worker's evidence of life (worker_dead): seen now, by the database's clock. Its wake-up
-- mark is the loop's to set and clear (worker_waiting_mark); it is only read back here, so the
-- worker learns when another took it for a dead one's (worker_waiting_clear_stale) and marks
-- itself again.
INSERT INTO worker_heartbeat (worker_id, hostname, pid, started_at, last_seen_at, delivered,
                              waiting)
VALUES (%(worker)s, %(hostname)s, %(pid)s, notifyqueue_now(), notifyqueue_now(), %(delivered)s,
        false)
ON CONFLICT (worker_id) DO UPDATE
SET last_seen_at = excluded.last_seen_at, delivered = excluded.delivered, stopped_at = NULL
RETURNING waiting;

-- name: worker_heartbeat_stop
UPDATE worker_heartbeat
SET stopped_at = notifyqueue_now(), last_seen_at = notifyqueue_now(), delivered = %(delivered)s,
    waiting = false
WHERE worker_id = %(worker)s;

-- name: worker_waiting_mark
-- The worker is about to sleep: creates notify from now on (notification_wakeup). The
-- exclusive lock waits for every create whose wake-up trigger has run and is not yet committed
-- (they hold it shared), so the claim the worker makes next sees their rows; it is released at
-- this statement's commit.
WITH locked AS (SELECT pg_advisory_xact_lock(hashtext('notifyqueue:wakeup')))
UPDATE worker_heartbeat SET waiting = true
FROM locked
WHERE worker_id = %(worker)s;

-- name: worker_waiting_clear_stale
-- The wake-up marks of workers not seen for %(seconds)s: killed outright, they cannot clear
-- their own, and the creates would notify for them for ever (notification_wakeup).
UPDATE worker_heartbeat
SET waiting = false
WHERE waiting AND last_seen_at < notifyqueue_now() - make_interval(secs => %(seconds)s);

-- name: worker_waiting_clear
-- The worker's claims are full: it needs no wake-up, and creates stop notifying unless
-- another worker waits.
UPDATE worker_heartbeat SET waiting = false WHERE worker_id = %(worker)s AND waiting;

-- name: simulated_messages_call
-- Counts a call to the simulated provider for each key; returns the call number and any final
-- answer. A new key is inserted with the answer its first call gets (outcome NULL: it failed
-- temporarily), so a first call is settled in this statement. Keys are inserted in sorted
-- order, so two workers sending overlapping keys (a claim taken over) lock them in the same
-- order; the one that inserts a key decides its first answer, the other counts a second call.
INSERT INTO simulated_provider_message AS m (idempotency_key, channel, recipient, calls, sends,
                                             outcome, message_id, first_call_at, last_call_at)
SELECT c.key, c.channel, c.recipient, 1, CASE WHEN c.outcome = 'ACCEPTED' THEN 1 ELSE 0 END,
       c.outcome, c.message_id, notifyqueue_now(), notifyqueue_now()
FROM unnest(%(keys)s::text[], %(channels)s::text[], %(recipients)s::text[],
            %(outcomes)s::text[], %(message_ids)s::text[])
     AS c(key, channel, recipient, outcome, message_id)
ORDER BY c.key
ON CONFLICT (idempotency_key) DO UPDATE
SET calls = m.calls + 1, last_call_at = excluded.last_call_at
RETURNING idempotency_key, calls, outcome, message_id;

-- name: simulated_messages_answer
-- Settles each key's final answer once: a key a concurrent call settled first is left as it
-- is and absent from the result (the caller then reads it: simulated_messages_get).
UPDATE simulated_provider_message AS m
SET outcome = a.outcome, message_id = a.message_id,
    sends = m.sends + CASE WHEN a.outcome = 'ACCEPTED' THEN 1 ELSE 0 END
FROM unnest(%(keys)s::text[], %(outcomes)s::text[], %(message_ids)s::text[])
     AS a(key, outcome, message_id)
WHERE m.idempotency_key = a.key AND m.outcome IS NULL
RETURNING m.idempotency_key, m.outcome, m.message_id;

-- name: simulated_messages_get
SELECT idempotency_key, outcome, message_id
FROM simulated_provider_message
WHERE idempotency_key = ANY(%(keys)s::text[]);
