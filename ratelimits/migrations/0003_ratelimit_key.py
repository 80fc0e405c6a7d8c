"""The rolling window keys on a digest of the rate-limit key instead of the recipient text.

- A push token may be 4,096 characters: a varchar(320) column made every admission of one
  fail, and the notification was dead-lettered without a send.
- An in-app recipient is a client's own user id, so it is keyed per (client, user): client A's
  user `u7` no longer spends client B's user `u7`'s window.

Existing window rows are carried over keyed by their recipient text (all of them counted as
email/SMS/push keys; an in-app row may count once under the old key until its window ends).
`ratelimit_admit()` is replaced: it takes the key's parts, reads the database clock, and lets
the next waiting row of the key forward when the admission leaves a slot free.
"""

from django.db import migrations, models

KEY = """
CREATE FUNCTION ratelimit_key(p_channel text, p_client uuid, p_recipient text) RETURNS bytea
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT sha256(convert_to(
        CASE WHEN p_channel = 'in_app' THEN 'in_app:' || p_client || ':' || p_recipient
             ELSE p_recipient END, 'UTF8'))
$$;
"""

ADMIT = """
DROP FUNCTION ratelimit_admit(text, timestamptz, uuid, uuid, integer, double precision, boolean);
CREATE FUNCTION ratelimit_admit(
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
    IF in_window + 1 < p_limit THEN
        -- A slot is still free: the next row a deferral holds back may go now (never earlier
        -- than it would have gone without the deferral). The claim re-checks it.
        PERFORM ratelimit_release_next(p_channel, p_client, p_recipient, p_notification);
    END IF;
    RETURN true;
END $$;
"""

RELEASE = """
CREATE FUNCTION ratelimit_release_next(
    p_channel text, p_client uuid, p_recipient text, p_except uuid
) RETURNS void
LANGUAGE sql VOLATILE AS $$
    UPDATE notification AS n
    SET due_at = greatest(n.rate_deferred_from, notifyqueue_now()),
        rate_deferred_from = NULL,
        updated_at = notifyqueue_now()
    WHERE n.id = (
        SELECT w.id FROM notification AS w
        WHERE w.recipient = p_recipient
          AND (CASE WHEN p_channel = 'in_app' THEN w.channel = 'in_app' AND w.client_id = p_client
                    ELSE w.channel <> 'in_app' END)
          AND w.status = 'PENDING' AND w.rate_deferred_from IS NOT NULL
          AND w.due_at > notifyqueue_now() AND w.id <> p_except
        ORDER BY w.priority, w.created_at, w.id
        LIMIT 1
    )
$$;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("ratelimits", "0002_ratelimit_admit_function"),
        ("notifications", "0006_rate_deferred_from"),
    ]

    operations = [
        migrations.RunSQL(KEY, reverse_sql="DROP FUNCTION ratelimit_key(text, uuid, text);"),
        migrations.AddField(
            model_name="recipientdelivery",
            name="key",
            field=models.BinaryField(null=True),
        ),
        migrations.RunSQL(
            "UPDATE ratelimit_delivery SET key = sha256(convert_to(recipient, 'UTF8'));",
            reverse_sql=migrations.RunSQL.noop,
        ),
        migrations.AlterField(
            model_name="recipientdelivery",
            name="key",
            field=models.BinaryField(),
        ),
        migrations.RemoveIndex(model_name="recipientdelivery", name="ratelimit_recipient_at"),
        migrations.RemoveField(model_name="recipientdelivery", name="recipient"),
        migrations.AddIndex(
            model_name="recipientdelivery",
            index=models.Index(fields=["key", "at"], name="ratelimit_key_at"),
        ),
        migrations.RunSQL(RELEASE, reverse_sql="DROP FUNCTION ratelimit_release_next;"),
        migrations.RunSQL(ADMIT, reverse_sql=migrations.RunSQL.noop),
    ]
