-- The release after failed attempts (ratelimits' `ratelimit_release_freed` calls it). It reads
-- and moves notifications, so it is this app's. Planned at each call for its values, as a
-- statement sent on its own is.
CREATE OR REPLACE FUNCTION ratelimit_release_freed(
    p_channels text[], p_client_ids uuid[], p_recipients text[], p_ids uuid[])
RETURNS void
LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan
AS $function$
BEGIN
    -- Failed attempts freed their slots (their window rows were deleted by the finish): for each
    -- such key, the next row a deferral holds back may go now. Only a key with a held row has
    -- anything to release: a probe of notification_rate_held tells first, as in the admission, so
    -- a claim that failed whole (a provider down) does not call the function for every row.
    PERFORM ratelimit_release_next(f.channel, f.client_id, f.recipient, f.id)
    FROM unnest(p_channels::text[], p_client_ids::uuid[], p_recipients::text[], p_ids::uuid[])
         AS f(channel, client_id, recipient, id)
    -- One row per key, as in the admission (not an EXISTS, which a plan may make a join
    -- reading every held row).
    WHERE (SELECT true FROM notification AS w
           WHERE md5(w.recipient)::uuid = md5(f.recipient)::uuid
             AND w.recipient = f.recipient AND w.rate_deferred_from IS NOT NULL
           LIMIT 1);
END $function$;
