-- Deletes every row of another table that refers to the notifications `p_ids`: their delivery
-- attempts and receipts, webhook events and those events' delivery attempts, inbox messages,
-- rate-limit records and the simulated provider's records of their sends (keyed
-- `<id>:<channel>`, one per channel in `p_channels`, found by primary key). Retention's one
-- list of them (delivery/sql/retention.sql), before the notifications go: deleted, or dropped
-- with their week. tests/integration/test_prune_notifications.py checks that every reference
-- to these tables is covered. Returns how many delivery attempts it deleted.
CREATE OR REPLACE FUNCTION notifications_history_delete(p_ids uuid[], p_channels text[])
 RETURNS integer
 LANGUAGE sql
AS $function$
    WITH events AS (
        SELECT e.id FROM webhook_event AS e WHERE e.notification_id = ANY (p_ids)
    ), webhook_attempts_gone AS (
        DELETE FROM webhook_delivery_attempt WHERE event_id IN (SELECT id FROM events)
    ), events_gone AS (
        DELETE FROM webhook_event WHERE id IN (SELECT id FROM events)
    ), attempts_gone AS (
        DELETE FROM delivery_attempt WHERE notification_id = ANY (p_ids) RETURNING 1
    ), receipts_gone AS (
        DELETE FROM delivery_receipt WHERE notification_id = ANY (p_ids)
    ), inbox_gone AS (
        DELETE FROM inbox_message WHERE notification_id = ANY (p_ids)
    ), rate_records_gone AS (
        DELETE FROM ratelimit_delivery WHERE notification_id = ANY (p_ids)
    ), simulated_gone AS (
        DELETE FROM simulated_provider_message
         WHERE idempotency_key IN (
               SELECT id::text || ':' || channel
                 FROM unnest(p_ids) AS id CROSS JOIN unnest(p_channels) AS channel)
    )
    SELECT count(*)::integer FROM attempts_gone
$function$;
