-- The database's clock: every decision several processes must agree on (due, claim expiry,
-- rate windows) reads it, never a process's own. Tests replace it to move time for every
-- connection at once (tests/support/clock.py), then load this file again.
CREATE OR REPLACE FUNCTION notifyqueue_now()
 RETURNS timestamp with time zone
 LANGUAGE sql
 STABLE PARALLEL SAFE
AS $function$ SELECT statement_timestamp() $function$;
