"""A worker admits its whole claim through the rate limit in one statement.

`ratelimit_admit_many` admits each claimed row in the order of the advisory locks their keys
take, so two workers admitting overlapping keys at once always lock in the same order and
cannot deadlock. Rows of one key follow each other, each seeing the slots the ones before it
took, and only when the last of them leaves a slot free does the key's next held row go
forward (once per key and claim: releasing one per admitted row released rows that the same
claim's next rows were about to fill, only to be deferred again). The locks are
transaction-scoped and the function is one statement: nothing outlives it, so it runs
unchanged behind PgBouncer in transaction mode. `ratelimit_admit` (one row) is now this
function with one row, so the rule lives in one place.

`ratelimit_release_next` becomes PL/pgSQL that looks for a held row before it updates: it
runs for most admissions and almost never finds one, and its UPDATE cost ~0.14 ms even when
it changed nothing (executor start-up opens every index of the table), two thirds of a
claim's admission. Its look-up has an index of its own (notifications 0008).
"""

from importlib import import_module

from django.db import migrations

# What this migration replaces, to put back when it is reversed.
ADMIT_BEFORE = import_module("ratelimits.migrations.0004_critical_releases_nothing").ADMIT
RELEASE_BEFORE = import_module("ratelimits.migrations.0003_ratelimit_key").RELEASE.replace(
    "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION"
)

ADMIT_MANY = """
CREATE FUNCTION ratelimit_admit_many(
    p_channels text[], p_clients uuid[], p_recipients text[], p_notifications uuid[],
    p_claims uuid[], p_criticals boolean[], p_limit integer, p_window_s double precision
) RETURNS TABLE (notification_id uuid, admitted boolean)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    r record;
    -- The key of the rows before this one, and the last of them (for its release).
    held_key bytea;
    held_channel text;
    held_client uuid;
    held_recipient text;
    held_id uuid;
    at_now timestamptz := notifyqueue_now();
    window_start timestamptz := at_now - make_interval(secs => p_window_s);
    in_window integer;
    slot_left boolean := false;
BEGIN
    FOR r IN
        SELECT c.*, ratelimit_key(c.channel, c.client_id, c.recipient) AS key
        FROM unnest(p_channels, p_clients, p_recipients, p_notifications, p_claims, p_criticals)
             AS c(channel, client_id, recipient, id, claim_token, critical)
        -- The order of the locks taken below, then each key's rows together.
        ORDER BY hashtextextended(encode(ratelimit_key(c.channel, c.client_id, c.recipient),
                                         'hex'), 1870),
                 ratelimit_key(c.channel, c.client_id, c.recipient), c.id
    LOOP
        IF held_key IS DISTINCT FROM r.key THEN
            IF slot_left THEN
                PERFORM ratelimit_release_next(held_channel, held_client, held_recipient,
                                               held_id);
            END IF;
            slot_left := false;
        END IF;
        held_key := r.key;
        held_channel := r.channel;
        held_client := r.client_id;
        held_recipient := r.recipient;
        held_id := r.id;
        notification_id := r.id;
        admitted := true;
        IF r.critical THEN
            -- Never held back, but counted; it cannot tell whether a slot is left over.
            slot_left := false;
        ELSE
            PERFORM pg_advisory_xact_lock(hashtextextended(encode(r.key, 'hex'), 1870));
            DELETE FROM ratelimit_delivery WHERE key = r.key AND at <= window_start;
            SELECT count(*) INTO in_window
            FROM ratelimit_delivery WHERE key = r.key AND at > window_start;
            admitted := in_window < p_limit;
            slot_left := admitted AND in_window + 1 < p_limit;
        END IF;
        IF admitted THEN
            INSERT INTO ratelimit_delivery (key, at, notification_id, claim_token)
            VALUES (r.key, at_now, r.id, r.claim_token);
        END IF;
        RETURN NEXT;
    END LOOP;
    IF slot_left THEN
        -- A slot is still free: the next row a deferral holds back may go now (never earlier
        -- than it would have gone without the deferral). The claim re-checks it.
        PERFORM ratelimit_release_next(held_channel, held_client, held_recipient, held_id);
    END IF;
END $$;

CREATE OR REPLACE FUNCTION ratelimit_release_next(
    p_channel text, p_client uuid, p_recipient text, p_except uuid
) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    held uuid;
BEGIN
    -- Look first, update only what was found: an UPDATE opens every index of the table even
    -- when it changes nothing, and most keys have no held row.
    SELECT w.id INTO held
    FROM notification AS w
    WHERE w.recipient = p_recipient
      AND (CASE WHEN p_channel = 'in_app' THEN w.channel = 'in_app' AND w.client_id = p_client
                ELSE w.channel <> 'in_app' END)
      AND w.status = 'PENDING' AND w.rate_deferred_from IS NOT NULL
      AND w.due_at > notifyqueue_now() AND w.id <> p_except
    ORDER BY w.priority, w.created_at, w.id
    LIMIT 1;
    IF held IS NOT NULL THEN
        UPDATE notification AS n
        SET due_at = greatest(n.rate_deferred_from, notifyqueue_now()),
            rate_deferred_from = NULL,
            updated_at = notifyqueue_now()
        WHERE n.id = held AND n.status = 'PENDING' AND n.rate_deferred_from IS NOT NULL;
    END IF;
END $$;

CREATE OR REPLACE FUNCTION ratelimit_admit(
    p_channel text, p_client uuid, p_recipient text, p_notification uuid, p_claim uuid,
    p_limit integer, p_window_s double precision, p_critical boolean
) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT admitted
    FROM ratelimit_admit_many(ARRAY[p_channel], ARRAY[p_client], ARRAY[p_recipient],
                              ARRAY[p_notification], ARRAY[p_claim], ARRAY[p_critical],
                              p_limit, p_window_s)
$$;
"""


class Migration(migrations.Migration):
    dependencies = [("ratelimits", "0004_critical_releases_nothing")]

    operations = [
        migrations.RunSQL(
            ADMIT_MANY,
            reverse_sql=[ADMIT_BEFORE, RELEASE_BEFORE, "DROP FUNCTION ratelimit_admit_many;"],
        )
    ]
