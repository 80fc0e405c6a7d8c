-- The circuit breakers' SQL. `CircuitRepository` is its only user. Each statement is one
-- round trip and decides its race inside PostgreSQL, on the database's clock
-- (notifyqueue_now()): a worker whose own clock is off neither probes early nor waits late.

-- name: circuit_register
INSERT INTO circuit_breaker (name, state, consecutive_failures, updated_at)
SELECT name, 'CLOSED', 0, notifyqueue_now() FROM unnest(%(names)s::text[]) AS name
ON CONFLICT (name) DO NOTHING;

-- name: circuit_read
-- probe_due: an OPEN circuit's cooldown, or a HALF_OPEN circuit's probe, has run out.
SELECT state, consecutive_failures, opened_at, probe_expires_at,
       coalesce((state = 'OPEN'
                 AND opened_at <= notifyqueue_now() - make_interval(secs => %(cooldown_s)s))
                OR (state = 'HALF_OPEN' AND probe_expires_at <= notifyqueue_now()), false)
           AS probe_due
FROM circuit_breaker WHERE name = %(name)s;

-- name: circuit_probe_take
-- The one statement that decides who probes. Concurrent callers queue on the row lock; each
-- re-evaluates the WHERE against the row the winner left (HALF_OPEN with a live probe), so
-- exactly one gets a token back, across every worker and process. A probe whose holder died
-- expires, and then the next caller takes it over.
UPDATE circuit_breaker
SET state = 'HALF_OPEN',
    probe_token = gen_random_uuid(),
    probe_expires_at = notifyqueue_now() + make_interval(secs => %(probe_timeout_s)s),
    updated_at = notifyqueue_now()
WHERE name = %(name)s
  AND ((state = 'OPEN' AND opened_at <= notifyqueue_now() - make_interval(secs => %(cooldown_s)s))
       OR (state = 'HALF_OPEN' AND probe_expires_at <= notifyqueue_now()))
RETURNING probe_token;

-- name: circuit_probe_succeeded
-- Only the current probe's holder may close the circuit.
UPDATE circuit_breaker
SET state = 'CLOSED', consecutive_failures = 0, opened_at = NULL,
    probe_token = NULL, probe_expires_at = NULL, updated_at = notifyqueue_now()
WHERE name = %(name)s AND state = 'HALF_OPEN' AND probe_token = %(token)s;

-- name: circuit_probe_failed
-- The probe failed: OPEN again, with a fresh cooldown from now.
UPDATE circuit_breaker
SET state = 'OPEN', opened_at = notifyqueue_now(), consecutive_failures = consecutive_failures + 1,
    probe_token = NULL, probe_expires_at = NULL, updated_at = notifyqueue_now()
WHERE name = %(name)s AND state = 'HALF_OPEN' AND probe_token = %(token)s;

-- name: circuit_succeeded
-- A call admitted while CLOSED succeeded: the failure run is over. Writes nothing when there
-- was no run (the common case), and ignores a late success once the circuit has opened:
-- only a probe closes an open circuit.
UPDATE circuit_breaker
SET consecutive_failures = 0, updated_at = notifyqueue_now()
WHERE name = %(name)s AND state = 'CLOSED' AND consecutive_failures > 0;

-- name: circuit_failed
-- A call admitted while CLOSED failed temporarily: one more in the run, and OPEN when the run
-- reaches the threshold. The row lock serialises concurrent failures, so the count is exact
-- and exactly one of them opens the circuit. A late failure once it is open changes nothing.
INSERT INTO circuit_breaker AS c (name, state, consecutive_failures, opened_at, updated_at)
VALUES (%(name)s,
        CASE WHEN %(threshold)s::int <= 1 THEN 'OPEN' ELSE 'CLOSED' END,
        1,
        CASE WHEN %(threshold)s::int <= 1 THEN notifyqueue_now() END,
        notifyqueue_now())
ON CONFLICT (name) DO UPDATE
SET consecutive_failures = c.consecutive_failures + 1,
    state = CASE WHEN c.consecutive_failures + 1 >= %(threshold)s::int THEN 'OPEN'
                 ELSE 'CLOSED' END,
    opened_at = CASE WHEN c.consecutive_failures + 1 >= %(threshold)s::int
                     THEN notifyqueue_now() END,
    updated_at = excluded.updated_at
WHERE c.state = 'CLOSED';

-- name: circuits_list
SELECT name, state, consecutive_failures, opened_at FROM circuit_breaker ORDER BY name;
