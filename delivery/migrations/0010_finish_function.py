"""`notification_finish_many(...)`: the finish statement as a PL/pgSQL function.

Planning the finish (four data-modifying steps over fourteen arrays) cost PostgreSQL about a
sixth of its execution on every batch of results, parsing it more. A PL/pgSQL function keeps
the plan of its statement for the life of the server connection. The plan does not depend on
the arrays (each result row finds its notification, attempt and rate-limit row by a unique
key), so the kept generic plan is the one a fresh planning of full tables gives. Sequential
scans are off for the function: a plan made while the tables were small (a new installation)
would otherwise scan them whole as they grow
(tests/integration/test_delivery_claims.py::test_a_turn_reads_only_what_it_touches_after_a_burst_its_plans_never_saw).
Nothing lives in the client's session: any server connection compiles the function on its
first call, so it runs through PgBouncer in transaction mode (docs/performance.md, "Seventh
round").

The rule is the statement's as it was (delivery/sql/queries.sql, `notification_finish`): each
result applies only to a PROCESSING row still held under its claim token; its attempt is
finished; a result other than SENT frees its rate-limit slot; an in-app delivery reaches the
inbox; each changed row is answered with whether its slot was freed.
"""

from django.db import migrations

ARGUMENTS = (
    "uuid[], uuid[], text[], text[], text[], text[], double precision[], integer[], boolean[], "
    "text[], text[], text[], text[], text[]"
)

FUNCTION = """
CREATE FUNCTION notification_finish_many(
    p_ids uuid[], p_tokens uuid[], p_statuses text[], p_outcomes text[], p_errors text[],
    p_message_ids text[], p_delays double precision[], p_attempt_deltas integer[],
    p_attempt_resets boolean[], p_channels text[], p_recipients text[], p_subjects text[],
    p_bodies text[], p_fallbacks text[]
) RETURNS TABLE (
    id uuid, status varchar, channel varchar, client_id uuid, recipient varchar,
    freed_slot boolean
)
LANGUAGE plpgsql VOLATILE
-- The plan is kept; one made while a table was small would read it whole for as long as the
-- connection lives (see ratelimits 0009). Every step has its index.
SET enable_seqscan = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH result AS (
        SELECT *
        FROM unnest(
            p_ids, p_tokens, p_statuses, p_outcomes, p_errors, p_message_ids, p_delays,
            p_attempt_deltas, p_attempt_resets, p_channels, p_recipients, p_subjects, p_bodies,
            p_fallbacks
        ) AS r(id, claim_token, status, outcome, error, message_id, delay_s, attempt_delta,
               attempt_reset, channel, recipient, subject, body, fallback_channels)
    ), finished AS (
        UPDATE notification AS n
        SET status = r.status,
            due_at = CASE WHEN r.delay_s IS NULL THEN n.due_at
                          ELSE notifyqueue_now() + make_interval(secs => r.delay_s) END,
            attempt_count = CASE WHEN r.attempt_reset THEN 0
                                 ELSE n.attempt_count + r.attempt_delta END,
            channel = coalesce(r.channel, n.channel),
            recipient = coalesce(r.recipient, n.recipient),
            subject = coalesce(r.subject, n.subject),
            body = coalesce(r.body, n.body),
            fallback_channels = coalesce(r.fallback_channels::jsonb, n.fallback_channels),
            last_error = CASE WHEN r.error IS NOT NULL THEN r.error ELSE n.last_error END,
            sent_at = CASE WHEN r.status = 'SENT' THEN notifyqueue_now() ELSE n.sent_at END,
            claim_token = NULL,
            claim_expires_at = NULL,
            updated_at = notifyqueue_now()
        FROM result AS r
        WHERE n.id = r.id AND n.claim_token = r.claim_token AND n.status = 'PROCESSING'
        RETURNING n.id, n.client_id, n.status, n.channel, n.recipient, n.subject, n.body,
                  n.metadata, r.claim_token, r.outcome, r.error, r.message_id
    ), attempt AS (
        UPDATE delivery_attempt AS a
        SET finished_at = notifyqueue_now(), outcome = f.outcome, error = f.error,
            provider_message_id = f.message_id
        FROM finished AS f
        WHERE a.claim_token = f.claim_token
    ), uncounted AS (
        DELETE FROM ratelimit_delivery AS d
        USING finished AS f
        WHERE d.claim_token = f.claim_token AND f.status <> 'SENT'
        RETURNING d.notification_id
    ), inbox AS (
        INSERT INTO inbox_message (id, client_id, user_id, notification_id, subject, body,
                                   metadata, created_at)
        SELECT gen_random_uuid(), f.client_id, f.recipient, f.id, f.subject, f.body, f.metadata,
               notifyqueue_now()
        FROM finished AS f
        WHERE f.channel = 'in_app' AND f.status = 'SENT'
        ON CONFLICT (notification_id) DO NOTHING
    )
    SELECT f.id, f.status, f.channel, f.client_id, f.recipient,
           EXISTS (SELECT 1 FROM uncounted AS u WHERE u.notification_id = f.id)
    FROM finished AS f;
END $$;
"""


class Migration(migrations.Migration):
    dependencies = [("delivery", "0009_attempt_notification_unchecked")]

    operations = [
        migrations.RunSQL(
            FUNCTION, reverse_sql=f"DROP FUNCTION notification_finish_many({ARGUMENTS});"
        ),
    ]
