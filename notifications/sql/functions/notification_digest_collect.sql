-- One batch of a bucket's close: the bucket's rows after p_after in id order (at most p_limit,
-- through notification_digest_items), those still waiting (PENDING, not past their expiry, no
-- send started) ended DIGESTED naming the bucket's digest; rows cancelled or expired before are
-- left as they are (an expired one still waiting is the expiry upkeep's). Guarded by the claim:
-- only while the bucket is CLOSING under p_token (its row held FOR SHARE for the statement, so a
-- takeover waits for the batch), and it extends the claim by p_claim_s. A row a cancel holds is
-- waited for (a cancel's statement is short) and then judged as it is. Each batch is its own
-- transaction, so a bucket of any size never holds more than p_limit rows locked at once.
-- Answers whether the claim held, the last id read (NULL: nothing left), the rows read (fewer
-- than p_limit: none left after them) and the rows ended.
CREATE OR REPLACE FUNCTION notification_digest_collect(p_bucket uuid, p_token uuid, p_after uuid, p_limit integer, p_claim_s double precision)
 RETURNS TABLE(held boolean, last_id uuid, scanned integer, digested integer)
 LANGUAGE plpgsql
AS $function$
DECLARE
    digest uuid;
    page_last uuid;
    read integer;
    ended integer;
BEGIN
    UPDATE notification_digest AS d
       SET claim_expires_at = notifyqueue_now() + make_interval(secs => p_claim_s)
     WHERE d.id = p_bucket AND d.claim_token = p_token AND d.state = 'CLOSING'
    RETURNING d.digest_id INTO digest;
    IF NOT FOUND THEN
        RETURN QUERY SELECT false, NULL::uuid, 0, 0;
        RETURN;
    END IF;
    WITH page AS (
        SELECT n.id FROM notification AS n
         WHERE n.digest_bucket_id = p_bucket
           AND n.id > coalesce(p_after, '00000000-0000-0000-0000-000000000000'::uuid)
         ORDER BY n.id
         LIMIT p_limit
    ), ended_rows AS (
        UPDATE notification AS n
           SET status = 'DIGESTED', digest_id = digest, updated_at = notifyqueue_now()
          FROM page
         WHERE n.id = page.id AND n.status = 'PENDING' AND n.send_started_at IS NULL
           AND (n.expires_at IS NULL OR n.expires_at > notifyqueue_now())
        RETURNING n.id
    )
    SELECT (SELECT page.id FROM page ORDER BY page.id DESC LIMIT 1),
           (SELECT count(*) FROM page), (SELECT count(*) FROM ended_rows)
      INTO page_last, read, ended;
    RETURN QUERY SELECT true, page_last, read, ended;
END $function$;
