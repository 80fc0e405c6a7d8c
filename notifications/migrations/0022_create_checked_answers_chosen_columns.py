"""`notification_create_checked(...)` answers only the columns its caller reads.

It answered the whole new row (`RETURNING *`, `SETOF notification`: 30 columns), of which the
statement that calls it (notifications/sql/notifications.sql) kept eight. PostgreSQL built
each of those rows, and the descriptions of their columns, twice: the insert's answer, and
the function's result set. Answering the eight, as `notifications_create_checked_many`
(migration 0016) does, took 71,000 of the 1,002,000 instructions PostgreSQL spent on a create
(callgrind, docs/performance.md, "Nineteenth round"). The insert and its rule are unchanged.
"""

import importlib

from django.db import migrations

# The function as migration 0012 made it: its arguments, and its text for the way back.
BEFORE = importlib.import_module("notifications.migrations.0012_create_checked_function")

FUNCTION = """
CREATE FUNCTION notification_create_checked(
    p_client_id uuid, p_idempotency_key text, p_request_fingerprint text, p_channel text,
    p_recipient text, p_subject text, p_body text, p_priority integer, p_metadata jsonb,
    p_user_id text, p_template text, p_payload jsonb, p_fallback_channels jsonb,
    p_delay_seconds integer, p_send_at timestamptz, p_max_attempts integer,
    p_key_prefix text, p_hashed_key text
) RETURNS TABLE (
    id uuid, metadata jsonb, payload jsonb, fallback_channels jsonb, send_at timestamptz,
    due_at timestamptz, created_at timestamptz, updated_at timestamptz
)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    at_now timestamptz := notifyqueue_now();
    due timestamptz := CASE WHEN p_delay_seconds IS NOT NULL
                              THEN at_now + make_interval(secs => p_delay_seconds)
                            ELSE greatest(coalesce(p_send_at, at_now), at_now)
                       END;
BEGIN
    RETURN QUERY
    INSERT INTO notification AS n (
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
    RETURNING n.id, nullif(n.metadata, '{}'::jsonb), n.payload,
              nullif(n.fallback_channels, '[]'::jsonb), n.send_at, n.due_at, n.created_at,
              n.updated_at;
END $$;
"""

DROP = f"DROP FUNCTION notification_create_checked({BEFORE.ARGUMENTS});"


class Migration(migrations.Migration):
    dependencies = [("notifications", "0021_column_rules_in_domains")]

    operations = [
        migrations.RunSQL(DROP + FUNCTION, reverse_sql=DROP + BEFORE.FUNCTION),
    ]
