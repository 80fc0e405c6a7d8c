-- Whether a worker is dead, by the database's clock: it stopped, or its heartbeat is older than
-- p_dead_after_s (NOTIFYQUEUE_WORKER_DEAD_AFTER_SECONDS). The one definition of a live worker:
-- the takeover of claims (notifications and webhook events) and /status read it. A worker with
-- no heartbeat row is not dead by this test: its claims wait for their claim timeout.
CREATE OR REPLACE FUNCTION worker_dead(p_worker text, p_dead_after_s double precision)
 RETURNS boolean
 LANGUAGE sql
 STABLE PARALLEL SAFE
AS $function$
    SELECT EXISTS (
        SELECT 1 FROM worker_heartbeat AS h
        WHERE h.worker_id = p_worker
          AND (h.stopped_at IS NOT NULL
               OR h.last_seen_at < notifyqueue_now() - make_interval(secs => p_dead_after_s))
    )
$function$;
