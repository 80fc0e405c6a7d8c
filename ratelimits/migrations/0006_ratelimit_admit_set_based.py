"""A claim's admission in four statements, whatever its size, instead of four per row.

The rule is `ratelimit_admit_many`'s (migration 0005), applied to the set: lock every
non-CRITICAL key of the claim in one global order; forget what left those keys' windows;
count each key's window and admit the rows of each key in turn (a row is admitted when the
window holds fewer than `limit` deliveries before it, the claim's earlier rows of its key
included; CRITICAL always, and counted); record the admitted; let a held row forward for each
key whose last row in the claim is an admitted non-CRITICAL one that left a slot free.

Each of these is its own statement inside the function, so each reads a snapshot taken after
every lock was granted: the counts see every admission committed by whoever held a lock before.
Row by row, the executor start-up of three statements per row (and the UPDATE-free look-up of
the freed slot) was most of a claim's admission.
"""

from importlib import import_module

from django.db import migrations

# 0005's function, to put back when this migration is reversed.
ADMIT_MANY_BEFORE = (
    import_module("ratelimits.migrations.0005_ratelimit_admit_many")
    .ADMIT_MANY.replace("CREATE FUNCTION ratelimit_admit_many", "CREATE OR REPLACE FUNCTION ratelimit_admit_many")
)

ADMIT_MANY = """
CREATE OR REPLACE FUNCTION ratelimit_admit_many(
    p_channels text[], p_clients uuid[], p_recipients text[], p_notifications uuid[],
    p_claims uuid[], p_criticals boolean[], p_limit integer, p_window_s double precision
) RETURNS TABLE (notification_id uuid, admitted boolean)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    at_now timestamptz := notifyqueue_now();
    window_start timestamptz := at_now - make_interval(secs => p_window_s);
    keys bytea[];
BEGIN
    SELECT array_agg(ratelimit_key(c.channel, c.client_id, c.recipient) ORDER BY c.n)
    INTO keys
    FROM unnest(p_channels, p_clients, p_recipients) WITH ORDINALITY
         AS c(channel, client_id, recipient, n);

    -- One global order (the lock id), so concurrent claims cannot deadlock. CRITICAL rows are
    -- never held back, so they need no lock; their keys are locked anyway when a non-CRITICAL
    -- row of the claim shares them.
    PERFORM pg_advisory_xact_lock(l.lock_id)
    FROM (
        SELECT DISTINCT hashtextextended(encode(k.key, 'hex'), 1870) AS lock_id
        FROM unnest(keys, p_criticals) AS k(key, critical)
        WHERE NOT k.critical
        ORDER BY 1
    ) AS l;

    DELETE FROM ratelimit_delivery AS d
    WHERE d.key = ANY (keys) AND d.at <= window_start;

    RETURN QUERY
    WITH claimed AS (
        SELECT c.id, c.claim_token, c.critical, c.key,
               row_number() OVER (PARTITION BY c.key ORDER BY c.id) AS nth
        FROM unnest(p_notifications, p_claims, p_criticals, keys)
             AS c(id, claim_token, critical, key)
    ), counted AS (
        SELECT d.key, count(*) AS in_window
        FROM ratelimit_delivery AS d
        WHERE d.key IN (SELECT DISTINCT key FROM claimed) AND d.at > window_start
        GROUP BY d.key
    ), decided AS (
        -- The rows before this one in the claim were admitted unless the window was already
        -- full before them, in which case it is full for this one too: so this row sees
        -- in_window + (nth - 1) deliveries.
        SELECT cl.id, cl.claim_token, cl.key,
               cl.critical OR coalesce(co.in_window, 0) + cl.nth - 1 < p_limit AS admitted
        FROM claimed AS cl
        LEFT JOIN counted AS co ON co.key = cl.key
    ), recorded AS (
        INSERT INTO ratelimit_delivery (key, at, notification_id, claim_token)
        SELECT de.key, at_now, de.id, de.claim_token FROM decided AS de WHERE de.admitted
    )
    SELECT de.id, de.admitted FROM decided AS de;

    -- A slot is still free after a key's last row of the claim (a non-CRITICAL one: a CRITICAL
    -- cannot tell): the next row a deferral holds back for that key may go now.
    PERFORM ratelimit_release_next(last.channel, last.client_id, last.recipient, last.id)
    FROM (
        SELECT DISTINCT ON (c.key) c.key, c.channel, c.client_id, c.recipient, c.id, c.critical
        FROM unnest(p_channels, p_clients, p_recipients, p_notifications, p_criticals, keys)
             AS c(channel, client_id, recipient, id, critical, key)
        ORDER BY c.key, c.id DESC
    ) AS last
    WHERE NOT last.critical
      AND (SELECT count(*) FROM ratelimit_delivery AS d
           WHERE d.key = last.key AND d.at > window_start) < p_limit;
END $$;
"""


class Migration(migrations.Migration):
    dependencies = [("ratelimits", "0005_ratelimit_admit_many")]

    operations = [
        migrations.RunSQL(ADMIT_MANY, reverse_sql=ADMIT_MANY_BEFORE)
    ]
