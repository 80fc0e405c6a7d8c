"""`ratelimit_admit()`: the rolling-window check and record in one round trip.

A function, because the count must be taken after the advisory lock is granted: in READ
COMMITTED each statement inside a volatile PL/pgSQL function takes a fresh snapshot, so the
count sees every admission committed by whoever held the lock before. One `SELECT
ratelimit_admit(...)` in autocommit then costs one round trip instead of five (BEGIN, lock,
count, insert, COMMIT), and the lock is released when that statement's transaction commits.
"""

from django.db import migrations

FUNCTION = """
CREATE FUNCTION ratelimit_admit(
    p_recipient text, p_now timestamptz, p_notification uuid, p_claim uuid,
    p_limit integer, p_window_s double precision, p_critical boolean
) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    window_start timestamptz := p_now - make_interval(secs => p_window_s);
    in_window integer;
BEGIN
    IF NOT p_critical THEN
        PERFORM pg_advisory_xact_lock(hashtextextended(p_recipient, 1870));
        DELETE FROM ratelimit_delivery WHERE recipient = p_recipient AND at <= window_start;
        SELECT count(*) INTO in_window
        FROM ratelimit_delivery WHERE recipient = p_recipient AND at > window_start;
        IF in_window >= p_limit THEN
            RETURN false;
        END IF;
    END IF;
    INSERT INTO ratelimit_delivery (recipient, at, notification_id, claim_token)
    VALUES (p_recipient, p_now, p_notification, p_claim);
    RETURN true;
END $$;
"""


class Migration(migrations.Migration):
    dependencies = [("ratelimits", "0001_initial")]

    operations = [
        migrations.RunSQL(
            FUNCTION,
            reverse_sql="DROP FUNCTION ratelimit_admit(text, timestamptz, uuid, uuid, integer, "
            "double precision, boolean);",
        )
    ]
