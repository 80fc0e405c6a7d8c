-- The admission: for each claimed row, lock its keys (advisory, in one global order so callers
-- never deadlock), forget deliveries that left the window, and record a delivery if the
-- (client, recipient) key has a slot and, with the ceiling on (p_ceiling > 0), so has the
-- address across clients (CRITICAL: always). p_recipient_keys are the recipients' counting
-- forms (notifyqueue/addresses.py); p_recipients as stored, to find held rows. The two last
-- parameters have defaults so that a worker of the previous release, still running while the
-- migration lands, admits through this function (by the recipient as stored). It reads
-- notification (held rows), so it is this app's.
CREATE OR REPLACE FUNCTION ratelimit_admit_many(p_channels text[], p_clients uuid[], p_recipients text[], p_notifications uuid[], p_claims uuid[], p_criticals boolean[], p_limit integer, p_window_s double precision, p_recipient_keys text[] DEFAULT NULL::text[], p_ceiling integer DEFAULT 0)
 RETURNS TABLE(notification_id uuid, admitted boolean)
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
 SET enable_seqscan TO 'off'
 SET enable_bitmapscan TO 'off'
 SET enable_hashjoin TO 'off'
 SET enable_mergejoin TO 'off'
 SET enable_memoize TO 'off'
AS $function$
DECLARE
    at_now timestamptz := notifyqueue_now();
    window_start timestamptz := at_now - make_interval(secs => p_window_s);
    keys bytea[];
    -- The ceiling's key per row: NULL with the ceiling off, and for in-app (a user id is a
    -- client's own, never shared with another client).
    address_keys bytea[];
BEGIN
    SELECT array_agg(ratelimit_key(c.channel, c.client_id, c.recipient_key) ORDER BY c.n),
           array_agg(CASE WHEN p_ceiling > 0 AND c.channel <> 'in_app'
                          THEN ratelimit_key(c.channel, NULL, c.recipient_key) END
                     ORDER BY c.n)
    INTO keys, address_keys
    FROM unnest(p_channels, p_clients, coalesce(p_recipient_keys, p_recipients)) WITH ORDINALITY
         AS c(channel, client_id, recipient_key, n);

    -- One global order (the lock id), so concurrent claims cannot deadlock. CRITICAL rows are
    -- never held back, so they need no lock; their keys are locked anyway when a non-CRITICAL
    -- row of the claim shares them.
    PERFORM pg_advisory_xact_lock(l.lock_id)
    FROM (
        SELECT DISTINCT hashtextextended(encode(k.key, 'hex'), 1870) AS lock_id
        FROM unnest(keys || address_keys, p_criticals || p_criticals) AS k(key, critical)
        WHERE NOT k.critical AND k.key IS NOT NULL
        ORDER BY 1
    ) AS l;

    DELETE FROM ratelimit_delivery AS d
    USING (SELECT DISTINCT k.key FROM unnest(keys) AS k(key)) AS k
    WHERE (d.key, d.at) BETWEEN (k.key, '-infinity'::timestamptz) AND (k.key, window_start);

    IF p_ceiling > 0 THEN
        DELETE FROM ratelimit_delivery AS d
        USING (SELECT DISTINCT k.key FROM unnest(address_keys) AS k(key)
               WHERE k.key IS NOT NULL) AS k
        -- The row comparison reads only this address's entries of ratelimit_address_key_at
        -- (IS NOT NULL lets the planner use that partial index), whatever statistics say.
        WHERE d.address_key IS NOT NULL
          AND (d.address_key, d.at) BETWEEN (k.key, '-infinity'::timestamptz)
                                        AND (k.key, window_start);
    END IF;

    RETURN QUERY
    WITH claimed AS (
        -- In the claim's order (the clients' turns, then each client's priority and due
        -- time): a key's slots and an address's ceiling go to the rows claimed first.
        SELECT c.id, c.claim_token, c.critical, c.key, c.address_key, c.n,
               row_number() OVER (PARTITION BY c.key ORDER BY c.n) AS nth
        FROM unnest(p_notifications, p_claims, p_criticals, keys, address_keys) WITH ORDINALITY
             AS c(id, claim_token, critical, key, address_key, n)
    ), limited AS (
        -- The rows before this one of its key were admitted unless its window was already
        -- full before them (then it is full for this one too), or the ceiling refused them
        -- (then, sharing this row's address, it refuses this one too): so this row sees
        -- in_window + (nth - 1) deliveries. One probe of ratelimit_key_at per row, never the
        -- whole window table, and no join between the claim's rows (with hash joins off, a
        -- join of the rows to their keys' counts compared every row with every key).
        SELECT cl.id, cl.claim_token, cl.critical, cl.key, cl.address_key, cl.n,
               cl.critical OR w.in_window + cl.nth - 1 < p_limit AS within_limit
        FROM claimed AS cl
        CROSS JOIN LATERAL (
            -- At most p_limit deliveries: any count from there up gives the same verdict.
            SELECT count(*) AS in_window
            FROM (SELECT FROM ratelimit_delivery AS d
                  WHERE (d.key, d.at) > (cl.key, window_start)
                    AND (d.key, d.at) <= (cl.key, 'infinity'::timestamptz)
                  LIMIT p_limit) AS counted
        ) AS w
    ), decided AS (
        -- The ceiling: the address's deliveries in the window, plus the claim's earlier rows
        -- of that address that their own key admitted (one the ceiling refused means it
        -- refuses this one too, so counting it changes no verdict). With the ceiling off every
        -- address key is NULL and the probe is never run.
        SELECT li.id, li.claim_token, li.key, li.address_key,
               li.within_limit
               AND (li.critical OR li.address_key IS NULL
                    OR a.in_window
                       + coalesce(sum(li.within_limit::integer) OVER (
                             PARTITION BY li.address_key ORDER BY li.n
                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)
                       < p_ceiling) AS admitted
        FROM limited AS li
        CROSS JOIN LATERAL (
            SELECT count(*) AS in_window
            FROM (SELECT FROM ratelimit_delivery AS d
                  WHERE li.address_key IS NOT NULL AND d.address_key IS NOT NULL
                    AND (d.address_key, d.at) > (li.address_key, window_start)
                    AND (d.address_key, d.at) <= (li.address_key, 'infinity'::timestamptz)
                  LIMIT p_ceiling) AS counted
        ) AS a
    ), recorded AS (
        INSERT INTO ratelimit_delivery (key, address_key, at, notification_id, claim_token)
        SELECT de.key, de.address_key, at_now, de.id, de.claim_token
        FROM decided AS de WHERE de.admitted
    )
    SELECT de.id, de.admitted FROM decided AS de;

    -- A slot is still free after a key's last row of the claim (a non-CRITICAL one: a CRITICAL
    -- cannot tell): the next row a deferral holds back for that key may go now.
    PERFORM ratelimit_release_next(held.channel, held.client_id, held.recipient, held.id)
    FROM (
        SELECT last.*
        FROM (
            SELECT DISTINCT ON (c.key) c.key, c.channel, c.client_id, c.recipient, c.id,
                   c.critical
            FROM unnest(p_channels, p_clients, p_recipients, p_notifications, p_criticals, keys)
                 AS c(channel, client_id, recipient, id, critical, key)
            ORDER BY c.key, c.id DESC
        ) AS last
        WHERE NOT last.critical
          -- Only a key with a held row has anything to release (notification_rate_held).
          -- A probe of one row per key: as an EXISTS, the kept plan made it a join that read
          -- every held row of every recipient to find the claim's.
          AND (SELECT true FROM notification AS w
               WHERE md5(w.recipient)::uuid = md5(last.recipient)::uuid
                 AND w.recipient = last.recipient AND w.rate_deferred_from IS NOT NULL
               LIMIT 1)
        -- Kept apart from the count below, which then runs only for the keys found here.
        OFFSET 0
    ) AS held
    WHERE (SELECT count(*) FROM (SELECT FROM ratelimit_delivery AS d
                                 WHERE (d.key, d.at) > (held.key, window_start)
                                   AND (d.key, d.at) <= (held.key, 'infinity'::timestamptz)
                                 LIMIT p_limit) AS counted) < p_limit;
END $function$;
