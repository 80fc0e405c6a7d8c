"""A CRITICAL admission does not count the window (it is never held back), so it cannot know
whether a slot is left over: it no longer lets a held row forward. (It did, every time, and
the released row was only claimed to be deferred again.)"""

from django.db import migrations

ADMIT = """
CREATE OR REPLACE FUNCTION ratelimit_admit(
    p_channel text, p_client uuid, p_recipient text, p_notification uuid, p_claim uuid,
    p_limit integer, p_window_s double precision, p_critical boolean
) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    k bytea := ratelimit_key(p_channel, p_client, p_recipient);
    at_now timestamptz := notifyqueue_now();
    window_start timestamptz := at_now - make_interval(secs => p_window_s);
    in_window integer := 0;
BEGIN
    IF NOT p_critical THEN
        PERFORM pg_advisory_xact_lock(hashtextextended(encode(k, 'hex'), 1870));
        DELETE FROM ratelimit_delivery WHERE key = k AND at <= window_start;
        SELECT count(*) INTO in_window
        FROM ratelimit_delivery WHERE key = k AND at > window_start;
        IF in_window >= p_limit THEN
            RETURN false;
        END IF;
    END IF;
    INSERT INTO ratelimit_delivery (key, at, notification_id, claim_token)
    VALUES (k, at_now, p_notification, p_claim);
    IF NOT p_critical AND in_window + 1 < p_limit THEN
        -- A slot is still free: the next row a deferral holds back may go now (never earlier
        -- than it would have gone without the deferral). The claim re-checks it.
        PERFORM ratelimit_release_next(p_channel, p_client, p_recipient, p_notification);
    END IF;
    RETURN true;
END $$;
"""


class Migration(migrations.Migration):
    dependencies = [("ratelimits", "0003_ratelimit_key")]

    operations = [migrations.RunSQL(ADMIT, reverse_sql=migrations.RunSQL.noop)]
