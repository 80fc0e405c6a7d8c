-- One notification per (client, idempotency key), across every partition of `notification`.
-- Each weekly partition has a unique index on (client_id, idempotency_key) (history_partition_add),
-- which settles concurrent creates of one key in the same partition (the create's ON CONFLICT
-- DO NOTHING); a key already used in another partition is found here, through each
-- partition's own index, and the row is skipped (NULL), as the conflict would skip it. Two
-- creates of one key can land in two partitions only when their ids straddle the start of a
-- week: inside five minutes of it, a client's creates take turns on an advisory lock held to
-- commit, so the later one's look-up (a fresh snapshot in this function) sees the earlier.
-- The look-up's plan is kept per connection; made while a week's partition held a few rows,
-- it read the week whole once 20,000 had arrived, so only index paths are allowed.
CREATE OR REPLACE FUNCTION notification_key_unique()
 RETURNS trigger
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET enable_bitmapscan TO 'off'
AS $function$
BEGIN
    IF history_week(NEW.created_at - interval '5 minutes')
       <> history_week(NEW.created_at + interval '5 minutes') THEN
        PERFORM pg_advisory_xact_lock(hashtext('notifyqueue:idempotency'),
                                      hashtext(NEW.client_id::text));
    END IF;
    IF EXISTS (SELECT 1 FROM notification AS n
                WHERE n.client_id = NEW.client_id AND n.idempotency_key = NEW.idempotency_key) THEN
        RETURN NULL;
    END IF;
    RETURN NEW;
END $function$;

CREATE OR REPLACE TRIGGER notification_key_unique BEFORE INSERT ON notification FOR EACH ROW EXECUTE FUNCTION notification_key_unique();
