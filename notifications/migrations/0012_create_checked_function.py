"""`notification_create_checked(...)`: the thin path's create as a PL/pgSQL function.

Parsing, analysing and planning the `INSERT ... SELECT ... WHERE EXISTS (key)` took about 300
µs of PostgreSQL's CPU on every create, half of what the create cost the server (its run, the
queue and wake-up triggers and the commit are the other half). PL/pgSQL keeps the plan of each
statement of a function for the life of the server connection, so a create now pays for
parsing a function call instead. Nothing of this lives in the client's session: any server
connection compiles the function on its first call, which is why it runs through PgBouncer in
transaction mode where a prepared statement would not (docs/performance.md, "Fourth round").

The rule is the statement's as it was (notifications/sql/notifications.sql): the row is
inserted only while the API key with this prefix and hash is still the client's, unrevoked
and unexpired by the database clock, and only if the client has not used the idempotency key;
otherwise nothing is returned. Times come from `notifyqueue_now()`: `send_at` and `due_at` are
`delay_seconds` from now, else `send_at` (a past one means now).
"""

from django.db import migrations

FUNCTION = """
CREATE FUNCTION notification_create_checked(
    p_client_id uuid, p_idempotency_key text, p_request_fingerprint text, p_channel text,
    p_recipient text, p_subject text, p_body text, p_priority integer, p_metadata jsonb,
    p_user_id text, p_template text, p_payload jsonb, p_fallback_channels jsonb,
    p_delay_seconds integer, p_send_at timestamptz, p_max_attempts integer,
    p_key_prefix text, p_hashed_key text
) RETURNS SETOF notification
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    at_now timestamptz := notifyqueue_now();
    due timestamptz := CASE WHEN p_delay_seconds IS NOT NULL
                              THEN at_now + make_interval(secs => p_delay_seconds)
                            ELSE greatest(coalesce(p_send_at, at_now), at_now)
                       END;
BEGIN
    RETURN QUERY
    INSERT INTO notification (
        id, client_id, idempotency_key, request_fingerprint,
        channel, recipient, subject, body, priority, metadata,
        user_id, template, payload, fallback_channels,
        status, send_at, due_at, attempt_count, max_attempts, operator_retries,
        created_at, updated_at
    )
    SELECT notifyqueue_uuid7(), p_client_id, p_idempotency_key, p_request_fingerprint,
           p_channel, p_recipient, p_subject, p_body, p_priority, p_metadata,
           p_user_id, p_template, p_payload, p_fallback_channels,
           'PENDING', due, due, 0, p_max_attempts, 0, at_now, at_now
     WHERE EXISTS (
        SELECT 1
          FROM clients_clientapikey AS k
         WHERE k.prefix = p_key_prefix
           AND k.hashed_key = p_hashed_key
           AND k.client_id = p_client_id
           AND NOT k.revoked
           AND (k.expiry_date IS NULL OR k.expiry_date >= at_now))
    ON CONFLICT ON CONSTRAINT notification_client_idempotency_key DO NOTHING
    RETURNING *;
END $$;
"""

ARGUMENTS = (
    "uuid, text, text, text, text, text, text, integer, jsonb, text, text, jsonb, jsonb, "
    "integer, timestamptz, integer, text, text"
)


class Migration(migrations.Migration):
    dependencies = [("notifications", "0011_notification_uuid7")]

    operations = [
        migrations.RunSQL(
            FUNCTION, reverse_sql=f"DROP FUNCTION notification_create_checked({ARGUMENTS});"
        ),
    ]
