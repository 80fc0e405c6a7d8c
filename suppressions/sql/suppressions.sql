-- The suppressions app's SQL: the send-time lookup and the operators' list.

-- name: suppression_matches
-- The send-time check, one statement for a whole claim: each claimed row whose address is
-- suppressed for its client (or for every client), with the reason. Probes the unique index
-- suppression_address_scope (channel, address_digest, client_id) once per row and scope: the
-- cost is the claim's, whatever the list's length. An address suppressed both for every
-- client and for this one reports the former (the address does not exist).
SELECT DISTINCT ON (r.id) r.id, s.reason
FROM unnest(%(ids)s::uuid[], %(client_ids)s::uuid[], %(channels)s::text[],
            %(addresses)s::text[]) AS r(id, client_id, channel, address)
CROSS JOIN LATERAL (VALUES (NULL::uuid), (r.client_id)) AS scope(client_id)
JOIN suppression AS s
  ON s.channel = r.channel
 AND s.address_digest = md5(r.address)::uuid
 AND s.client_id IS NOT DISTINCT FROM scope.client_id
ORDER BY r.id, s.client_id NULLS FIRST;

-- name: suppression_add
-- Adds an entry unless the same (channel, address, scope) has one; either way answers the
-- entry, `created` telling which.
WITH added AS (
    INSERT INTO suppression (id, channel, address, address_digest, client_id, reason, source,
                             created_at)
    VALUES (gen_random_uuid(), %(channel)s, %(address)s, md5(%(address)s)::uuid,
            %(client_id)s, %(reason)s, %(source)s, notifyqueue_now())
    ON CONFLICT ON CONSTRAINT suppression_address_scope DO NOTHING
    RETURNING id, channel, address, client_id, reason, source, created_at
)
SELECT id, channel, address, client_id, reason, source, created_at, true AS created
FROM added
UNION ALL
SELECT id, channel, address, client_id, reason, source, created_at, false AS created
FROM suppression
WHERE channel = %(channel)s AND address_digest = md5(%(address)s)::uuid
  AND client_id IS NOT DISTINCT FROM %(client_id)s::uuid
  AND NOT EXISTS (SELECT FROM added);

-- name: suppression_page
-- Newest first, by keyset on (created_at, id) after the cursor's position (the index
-- suppression_recent); limit + 1 rows tell whether another page follows.
SELECT id, channel, address, client_id, reason, source, created_at
FROM suppression
WHERE (%(channel)s::text IS NULL OR channel = %(channel)s::text)
  AND (%(after_created_at)s::timestamptz IS NULL
       OR (created_at, id) < (%(after_created_at)s::timestamptz, %(after_id)s::uuid))
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s;

-- name: suppression_remove
DELETE FROM suppression
WHERE id = %(id)s
RETURNING id, channel, address, client_id, reason, source, created_at;
