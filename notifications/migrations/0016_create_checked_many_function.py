"""`notifications_create_checked_many(items)`: several single creates in one statement.

The API process gathers the single creates that arrive while one of its create statements is
running and sends them as one statement (notifications/repositories.py, `CreateCombiner`).
Each item is `notification_create_checked`'s (migration 0012) as a JSON object, with its own
client and API key: an item is inserted only while that key is still its client's, unrevoked
and unexpired (database clock), and only if its client has not used its idempotency key. The
caller sends no two items with the same client and key. Rows are inserted in the order of
(client, key), so two such statements that meet on the same keys wait for each other instead
of deadlocking. Each inserted row answers its client and key (to find its item) and what the
database chose or rewrote; an item that inserted nothing answers nothing, and its caller goes
the long way, as with the single function.

A PL/pgSQL function for the reason the single one is: its plan is made once per server
connection, never kept in the client's session (PgBouncer's transaction mode).
"""

from django.db import migrations

FUNCTION = """
CREATE FUNCTION notifications_create_checked_many(p_items jsonb)
RETURNS TABLE (
    client_id uuid, idempotency_key text, id uuid, metadata jsonb, payload jsonb,
    fallback_channels jsonb, send_at timestamptz, due_at timestamptz,
    created_at timestamptz, updated_at timestamptz
)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    at_now timestamptz := notifyqueue_now();
BEGIN
    RETURN QUERY
    INSERT INTO notification AS n (
        id, client_id, idempotency_key, request_fingerprint,
        channel, recipient, subject, body, priority, metadata,
        user_id, template, payload, fallback_channels,
        status, send_at, due_at, attempt_count, max_attempts, operator_retries,
        created_at, updated_at
    )
    SELECT notifyqueue_uuid7(), i.client_id, i.idempotency_key, i.request_fingerprint,
           i.channel, i.recipient, i.subject, i.body, i.priority, i.metadata::jsonb,
           i.user_id, i.template, i.payload::jsonb, i.fallback_channels::jsonb,
           'PENDING', due.at, due.at, 0, i.max_attempts, 0, at_now, at_now
      FROM jsonb_to_recordset(p_items) AS i(
           client_id uuid, idempotency_key text, request_fingerprint text, channel text,
           recipient text, subject text, body text, priority smallint, metadata text,
           user_id text, template text, payload text, fallback_channels text,
           delay_seconds integer, send_at timestamptz, max_attempts integer,
           key_prefix text, hashed_key text)
     CROSS JOIN LATERAL (
        SELECT CASE WHEN i.delay_seconds IS NOT NULL
                      THEN at_now + make_interval(secs => i.delay_seconds)
                    ELSE greatest(coalesce(i.send_at, at_now), at_now)
               END AS at
     ) AS due
     WHERE EXISTS (
        SELECT 1
          FROM clients_clientapikey AS k
         WHERE k.prefix = i.key_prefix
           AND k.hashed_key = i.hashed_key
           AND k.client_id = i.client_id
           AND NOT k.revoked
           AND (k.expiry_date IS NULL OR k.expiry_date >= at_now))
     ORDER BY i.client_id, i.idempotency_key
    ON CONFLICT ON CONSTRAINT notification_client_idempotency_key DO NOTHING
    RETURNING n.client_id, n.idempotency_key::text, n.id, nullif(n.metadata, '{}'::jsonb),
              n.payload, nullif(n.fallback_channels, '[]'::jsonb), n.send_at, n.due_at,
              n.created_at, n.updated_at;
END $$;
"""


class Migration(migrations.Migration):
    dependencies = [("notifications", "0015_cancelled_rows_not_held")]

    operations = [
        migrations.RunSQL(
            FUNCTION, reverse_sql="DROP FUNCTION notifications_create_checked_many(jsonb);"
        ),
    ]
