-- The deferral of one claim: notification_rate_defer_many for one row, ahead 1,000 rows (a
-- worker of the previous release, still running while the migration lands, defers through
-- it). The two last parameters have defaults for the release before that one. PL/pgSQL, so
-- that a migration older than notification_rate_defer_many can still create it.
CREATE OR REPLACE FUNCTION notification_rate_defer(
    p_channel text, p_client_id uuid, p_recipient text, p_notification_id uuid,
    p_claim_token uuid, p_limit integer, p_window_s double precision,
    p_recipient_key text DEFAULT NULL, p_ceiling integer DEFAULT 0)
RETURNS TABLE(due_at timestamptz)
LANGUAGE plpgsql
AS $function$
BEGIN
    RETURN QUERY
    SELECT d.due_at
    FROM notification_rate_defer_many(ARRAY[p_channel], ARRAY[p_client_id], ARRAY[p_recipient],
                                      ARRAY[coalesce(p_recipient_key, p_recipient)],
                                      ARRAY[p_notification_id], ARRAY[p_claim_token], p_limit,
                                      p_window_s, p_ceiling, 1000) AS d;
END $function$;
