-- The close's claim: up to p_limit buckets due to close, each claimed for p_claim_s under a new
-- token by p_worker. Due: an OPEN bucket whose window ended (read through
-- notification_digest_due, earliest first), or a CLOSING one nobody holds (sealed by a create),
-- whose claim expired, or whose worker is dead (worker_dead, as the takeover of notification
-- claims; p_dead_after_s NULL judges no worker by its heartbeat). SKIP LOCKED: a bucket a create
-- is joining, or another worker is claiming or writing under its claim, is left to the next
-- turn, so creates never wait for the close and two workers never hold one bucket. The bucket's
-- digest id is chosen by its first claim and kept by every later one, so the rows every holder
-- marks name the same digest. Cost: the due and closing buckets (two partial indexes), never the
-- buckets closed before.
CREATE OR REPLACE FUNCTION notification_digests_claim(p_worker text, p_limit integer, p_claim_s double precision, p_dead_after_s double precision)
 RETURNS TABLE(id uuid, client_id uuid, digest_key text, channel text, recipient text, user_id text, template text, closes_at timestamp with time zone, collected integer, digest_id uuid, claim_token uuid)
 LANGUAGE sql
AS $function$
    WITH ended AS (
        SELECT d.id FROM notification_digest AS d
         WHERE d.state = 'OPEN' AND d.closes_at <= notifyqueue_now()
         ORDER BY d.closes_at
         LIMIT p_limit
         FOR UPDATE SKIP LOCKED
    ), unheld AS (
        SELECT d.id FROM notification_digest AS d
         WHERE d.state = 'CLOSING'
           AND (d.claim_token IS NULL
                OR d.claim_expires_at <= notifyqueue_now()
                OR (p_dead_after_s IS NOT NULL AND worker_dead(d.claimed_by, p_dead_after_s)))
         ORDER BY d.claim_expires_at NULLS FIRST
         LIMIT p_limit
         FOR UPDATE SKIP LOCKED
    ), chosen AS (
        (SELECT unheld.id FROM unheld UNION ALL SELECT ended.id FROM ended) LIMIT p_limit
    )
    UPDATE notification_digest AS d
       SET state = 'CLOSING',
           claim_token = gen_random_uuid(),
           claimed_by = p_worker,
           claim_expires_at = notifyqueue_now() + make_interval(secs => p_claim_s),
           digest_id = coalesce(d.digest_id, notifyqueue_uuid7())
      FROM chosen
     WHERE d.id = chosen.id
    RETURNING d.id, d.client_id, d.digest_key::text, d.channel::text, d.recipient::text,
              d.user_id::text, d.template::text, d.closes_at, d.collected, d.digest_id,
              d.claim_token;
$function$;
