-- name: client_request_count
-- Counts `count` API requests (1, or a block a process reserves, clients/throttling.py) in the
-- client's current fixed window and answers the window's count and the seconds left in it.
-- Windows are aligned on the database clock, so every API process agrees on them; a request
-- in a new window starts the count again. One row per client: the cost never grows with
-- traffic or history.
INSERT INTO clients_request_window AS w (client_id, window_start, requests)
VALUES (
    %(client_id)s,
    date_bin(make_interval(secs => %(window_s)s), notifyqueue_now(), TIMESTAMPTZ '2000-01-01'),
    %(count)s
)
ON CONFLICT (client_id) DO UPDATE
SET window_start = EXCLUDED.window_start,
    requests = CASE WHEN w.window_start = EXCLUDED.window_start
                    THEN w.requests + EXCLUDED.requests
                    ELSE EXCLUDED.requests END
RETURNING
    requests,
    EXTRACT(EPOCH FROM window_start + make_interval(secs => %(window_s)s) - notifyqueue_now())
        ::float8 AS seconds_left;

-- name: api_key_client
-- The unrevoked key with this prefix (unique, indexed) and its client. Expiry is decided by
-- the database clock. Revoking a key takes effect on the next request: nothing is cached.
SELECT k.id AS key_id,
       k.hashed_key,
       k.expiry_date IS NOT NULL AND k.expiry_date < notifyqueue_now() AS expired,
       c.id AS client_id,
       c.name AS client_name,
       c.is_operator,
       c.may_send_critical
  FROM clients_clientapikey AS k
  JOIN clients_client AS c ON c.id = k.client_id
 WHERE k.prefix = %(prefix)s
   AND NOT k.revoked;
