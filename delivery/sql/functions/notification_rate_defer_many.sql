-- The deferral (ratelimits' `ratelimit_defer_many` calls it), for every over-limit claim of a
-- worker's step in one statement, run by the caller under the keys' advisory locks (taken by
-- the admission's re-check in the same transaction). It ends those claims, guarded by each
-- claim's token and PROCESSING as the finish is, and finishes their attempt rows, so it is
-- the worker's. Planned at each call for its values, as a statement sent on its own is.
--
-- Per key (channel, client, recipient key), bounded whatever the key's backlog:
-- * the rows it moves: the key's claimed rows, and those of the key among the first
--   p_ahead due rows of the client's (priority, client) pairs of those rows (the head
--   of queue_pending_client, which the client's next claims would read), so the rows in the
--   way of the client's other recipients leave it a chunk at a time; the key's rows further
--   back are moved by later deferrals, when claims reach them;
-- * the slots: the window's newest `limit` deliveries t_0 <= ... <= t_{N-1} give the slots
--   t_k + window * m (m >= 1). Earlier deferrals handed out the slots up to the latest due
--   time among the key's held rows (a backward probe of queue_pending_recipient: the anchor,
--   with the number of held rows at exactly that time); the moved rows take the next free
--   slots from there, one each, in claim order. A key with no held row starts at the
--   window's first slot.
-- A row keeps the time it had of its own when that is later (its send_at or retry backoff,
-- kept in rate_deferred_from while a deferral holds it later), and with the ceiling on waits
-- for the address's slot too. The check at claim time stays the authority; this schedule
-- only keeps rows out of the way.
CREATE OR REPLACE FUNCTION notification_rate_defer_many(
    p_channels text[], p_client_ids uuid[], p_recipients text[], p_recipient_keys text[],
    p_ids uuid[], p_claim_tokens uuid[], p_limit integer, p_window_s double precision,
    p_ceiling integer, p_ahead integer)
RETURNS TABLE(notification_id uuid, due_at timestamptz)
LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan
AS $function$
#variable_conflict use_column
DECLARE
    at_now timestamptz := notifyqueue_now();
    window_start timestamptz := at_now - make_interval(secs => p_window_s);
    k record;
BEGIN
    FOR k IN
        SELECT c.channel, c.client_id, c.recipient_key,
               ratelimit_key(c.channel, c.client_id, c.recipient_key) AS key,
               array_agg(c.id) AS ids, array_agg(c.claim_token) AS tokens,
               -- The recipient as stored, in each spelling the key's claims have.
               array_agg(DISTINCT c.recipient) AS recipients
        FROM unnest(p_channels, p_client_ids, p_recipients,
                    coalesce(p_recipient_keys, p_recipients), p_ids, p_claim_tokens)
             AS c(channel, client_id, recipient, recipient_key, id, claim_token)
        GROUP BY c.channel, c.client_id, c.recipient_key
        ORDER BY 4
    LOOP
        RETURN QUERY
        WITH slot AS (
            -- The window's newest p_limit deliveries, oldest first: slot k's times are
            -- at + window * m. Fewer than p_limit: a slot is free, rows are due now and
            -- checked again.
            SELECT newest.at, row_number() OVER (ORDER BY newest.at) - 1 AS k
            FROM (SELECT d.at FROM ratelimit_delivery AS d
                  WHERE (d.key, d.at) > (k.key, window_start)
                    AND (d.key, d.at) <= (k.key, 'infinity'::timestamptz)
                  ORDER BY d.key DESC, d.at DESC
                  LIMIT p_limit) AS newest
        ), full_window AS (
            SELECT count(*) = p_limit AS is_full FROM slot
        ), held AS (
            -- The latest slot an earlier deferral handed out (NULL: none waits) and how many
            -- held rows have exactly that time: a backward walk of the key's waiting rows by
            -- due time (queue_pending_recipient) to the first held one (past only rows the
            -- client itself scheduled later), then the held rows at that time.
            SELECT anchor.at,
                   (SELECT count(*) FROM notification_queue AS q
                    WHERE q.status = 'PENDING'
                      AND q.recipient_digest = ANY (ARRAY(SELECT md5(r)::uuid
                                                          FROM unnest(k.recipients) AS r))
                      AND q.client_id = k.client_id AND q.channel = k.channel
                      AND q.due_at = anchor.at
                      AND (SELECT h.rate_deferred_from IS NOT NULL
                                  AND h.recipient = ANY (k.recipients)
                           FROM notification AS h WHERE h.id = q.id)) AS taken
            FROM (SELECT max(latest.due_at) AS at
                  FROM unnest(k.recipients) AS r(recipient)
                  CROSS JOIN LATERAL (
                      -- Each queue row's record is checked by a subquery, not a join: a
                      -- join could start from the record's held rows and read all of them.
                      SELECT q.due_at FROM notification_queue AS q
                      WHERE q.status = 'PENDING'
                        AND q.recipient_digest = md5(r.recipient)::uuid
                        AND q.client_id = k.client_id AND q.channel = k.channel
                        AND (SELECT h.rate_deferred_from IS NOT NULL
                                    AND h.recipient = r.recipient
                             FROM notification AS h WHERE h.id = q.id)
                      ORDER BY q.recipient_digest DESC, q.client_id DESC, q.channel DESC,
                               q.due_at DESC
                      LIMIT 1) AS latest) AS anchor
        ), free AS (
            -- Each slot's first time at or after the anchor, in time order: the free slots
            -- are these (less the `taken` of them at exactly the anchor), then each a window
            -- later, and so on.
            SELECT f.at, row_number() OVER (ORDER BY f.at, f.k) - 1 AS r,
                   count(*) FILTER (WHERE f.at = f.anchor) OVER () AS at_anchor
            FROM (SELECT s.k, h.at AS anchor,
                         s.at + make_interval(secs => p_window_s * CASE
                             WHEN h.at IS NULL THEN 1
                             ELSE greatest(1, ceil(extract(epoch FROM h.at - s.at)
                                                   / p_window_s::numeric))::integer
                         END) AS at
                  FROM slot AS s CROSS JOIN held AS h) AS f
        ), address AS (
            -- With the ceiling on, the address's newest p_ceiling deliveries across clients:
            -- when they fill it, nothing of this key can go before the oldest of them leaves
            -- the window.
            SELECT CASE WHEN count(*) >= p_ceiling
                        THEN min(newest.at) + make_interval(secs => p_window_s) END AS free_at
            FROM (SELECT d.at FROM ratelimit_delivery AS d
                  -- The address's entries of ratelimit_address_key_at only, newest first.
                  WHERE p_ceiling > 0 AND k.channel <> 'in_app' AND d.address_key IS NOT NULL
                    AND (d.address_key, d.at)
                        > (ratelimit_key(k.channel, NULL, k.recipient_key), window_start)
                    AND (d.address_key, d.at)
                        <= (ratelimit_key(k.channel, NULL, k.recipient_key),
                            'infinity'::timestamptz)
                  ORDER BY d.address_key DESC, d.at DESC
                  LIMIT p_ceiling) AS newest
        ), ahead AS (
            -- The head of the client's pairs of the claimed rows' priorities: its first due
            -- rows in the claim's order, at most p_ahead a pair, whoever's they are.
            SELECT head.id
            FROM (SELECT DISTINCT n.priority::smallint AS priority FROM notification AS n
                  WHERE n.id = ANY (k.ids) AND n.priority > 0) AS pr
            CROSS JOIN LATERAL (
                -- Equalities and a range, so that the range's end stops the walk of
                -- queue_pending_client (a row comparison's end does not: the walk would go on
                -- through the pair's rows held ahead, the backlog itself).
                SELECT q.id, q.channel, q.recipient_digest FROM notification_queue AS q
                WHERE q.status = 'PENDING' AND q.priority = pr.priority
                  AND q.client_id = k.client_id AND q.due_at <= at_now
                ORDER BY q.priority, q.client_id, q.due_at, q.created_at
                LIMIT p_ahead
            ) AS head
            WHERE head.channel = k.channel
              AND head.recipient_digest = ANY (ARRAY(SELECT md5(r)::uuid
                                                     FROM unnest(k.recipients) AS r))
        ), moving AS (
            -- The claimed rows (matched by id: a send-time re-check may have switched one to
            -- the user's new address, which the stored row does not show) and the key's rows
            -- at the head as stored. A row a digest bucket collected waits for the bucket's
            -- close, not a slot; a held row whose slot has come is left for the claims.
            SELECT n.id, n.priority, n.created_at,
                   coalesce(n.rate_deferred_from, n.due_at) AS own_due_at,
                   n.id = ANY (k.ids) AS claimed
            FROM notification AS n
            WHERE n.id = ANY (k.ids)
            UNION ALL
            SELECT n.id, n.priority, n.created_at, n.due_at, false
            FROM notification AS n
            WHERE n.id IN (SELECT a.id FROM ahead AS a)
              AND NOT n.id = ANY (k.ids)
              AND n.recipient = ANY (k.recipients)
              AND n.channel = k.channel AND n.client_id = k.client_id
              AND n.priority > 0 AND n.status = 'PENDING'
              AND n.send_at <= at_now AND n.due_at <= at_now
              AND n.digest_bucket_id IS NULL AND n.rate_deferred_from IS NULL
        ), schedule AS (
            -- Row i of the chunk, in claim order, after the anchor's slots already taken: the
            -- (i mod N)-th free slot, (i div N) windows later.
            SELECT place.id, place.claimed, place.own_due_at,
                   greatest(place.own_due_at,
                            CASE WHEN (SELECT fw.is_full FROM full_window AS fw)
                                 THEN f.at + make_interval(secs => p_window_s * (place.i / p_limit))
                                 ELSE at_now
                            END,
                            (SELECT a.free_at FROM address AS a)) AS due_at
            FROM (SELECT m.*, row_number() OVER (ORDER BY m.priority, m.created_at, m.id) - 1
                             + least((SELECT h.taken FROM held AS h),
                                     coalesce((SELECT max(fr.at_anchor) FROM free AS fr), 0))
                             AS i
                  FROM moving AS m) AS place
            LEFT JOIN free AS f ON f.r = place.i % p_limit
        ), others AS (
            UPDATE notification AS n
            SET due_at = sc.due_at,
                rate_deferred_from = CASE WHEN sc.due_at > sc.own_due_at THEN sc.own_due_at END,
                updated_at = at_now
            FROM schedule AS sc
            WHERE n.id = sc.id AND NOT sc.claimed
              AND n.status = 'PENDING' AND n.due_at <= at_now AND n.due_at <> sc.due_at
        ), deferred AS (
            UPDATE notification AS n
            SET status = 'PENDING',
                due_at = sc.due_at,
                rate_deferred_from = CASE WHEN sc.due_at > sc.own_due_at THEN sc.own_due_at END,
                attempt_count = n.attempt_count - 1,
                claim_token = NULL,
                claim_expires_at = NULL,
                updated_at = at_now
            FROM schedule AS sc, unnest(k.ids, k.tokens) AS c(id, claim_token)
            WHERE n.id = sc.id AND sc.claimed AND c.id = n.id
              AND n.claim_token = c.claim_token AND n.status = 'PROCESSING'
            RETURNING n.id, n.due_at, c.claim_token
        ), attempt AS (
            UPDATE delivery_attempt AS a
            SET finished_at = at_now, outcome = 'RATE_LIMITED'
            FROM deferred AS d
            WHERE a.claim_token = d.claim_token
        )
        SELECT d.id, d.due_at FROM deferred AS d;
    END LOOP;
END $function$;
