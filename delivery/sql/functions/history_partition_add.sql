-- Adds the partition of a history table (notification, delivery_attempt, webhook_event,
-- webhook_delivery_attempt) that holds the week starting at history_week(p_week): the rows
-- whose `p_key` (a UUIDv7: the row's own id, or its notification's or event's) was made in that
-- week, [notifyqueue_uuid7_floor(week), notifyqueue_uuid7_floor(week + 7 days)). Named
-- <table>_<yyyymmdd of the Monday>. Returns the new partition's name, or NULL when it exists.
--
-- Any rows of that week already in the table's default partition (<table>_default: rows made
-- under a database clock set far ahead, or with ids that are not UUIDv7) move into the new
-- one first, in the same transaction, so attaching it never fails. The new partition takes
-- the default partition's storage parameters (fillfactor), the parent's indexes (named
-- <index>_<yyyymmdd>, attached to the parent's by PostgreSQL), and, when `p_unique` names columns, a unique index of its own on them: the
-- notification's (client_id, idempotency_key), which a partitioned table cannot hold across
-- partitions (see notification_key_unique for the rest). ATTACH takes SHARE UPDATE EXCLUSIVE
-- on the parent, so reads and writes go on; the default partition is locked while it is
-- checked for rows of the week, which lock_timeout bounds.
CREATE OR REPLACE FUNCTION history_partition_add(p_parent regclass, p_key text, p_week timestamp with time zone, p_unique text DEFAULT NULL::text)
 RETURNS text
 LANGUAGE plpgsql
 SET lock_timeout TO '2s'
AS $function$
DECLARE
    week timestamptz := history_week(p_week);
    lo uuid := notifyqueue_uuid7_floor(week);
    hi uuid := notifyqueue_uuid7_floor(week + interval '7 days');
    parent text := (SELECT c.relname FROM pg_class AS c WHERE c.oid = p_parent);
    part text := parent || '_' || to_char(week AT TIME ZONE 'UTC', 'YYYYMMDD');
    fallback text := parent || '_default';
    options text[];
    parent_index record;
BEGIN
    -- Workers add weeks at the same time: one at a time.
    PERFORM pg_advisory_xact_lock(hashtext('notifyqueue:history_partitions'));
    IF to_regclass(quote_ident(part)) IS NOT NULL THEN
        RETURN NULL;
    END IF;
    EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE)',
                   part, parent);
    SELECT c.reloptions INTO options FROM pg_class AS c WHERE c.oid = to_regclass(fallback);
    IF options IS NOT NULL THEN
        EXECUTE format('ALTER TABLE %I SET (%s)', part, array_to_string(options, ', '));
    END IF;
    -- The parent's indexes (but its primary key's, which PostgreSQL makes with the constraint),
    -- named after the parent's with the week's date, so a plan names the index it uses.
    FOR parent_index IN
        SELECT c.relname, pg_get_indexdef(i.indexrelid) AS definition
          FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
         WHERE i.indrelid = p_parent
           AND NOT EXISTS (SELECT 1 FROM pg_constraint AS k WHERE k.conindid = i.indexrelid)
    LOOP
        EXECUTE regexp_replace(parent_index.definition, '^(CREATE (UNIQUE )?INDEX )\S+ ON ONLY \S+',
                               '\1' || quote_ident(parent_index.relname || substring(part FROM '_\d{8}$'))
                               || ' ON ' || quote_ident(part));
    END LOOP;
    IF p_unique IS NOT NULL THEN
        EXECUTE format('CREATE UNIQUE INDEX ON %I (%s)', part, p_unique);
    END IF;
    EXECUTE format('WITH moved AS (DELETE FROM %I WHERE %I >= $1 AND %I < $2 RETURNING *) '
                   'INSERT INTO %I SELECT * FROM moved', fallback, p_key, p_key, part)
        USING lo, hi;
    EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                   parent, part, lo, hi);
    RETURN part;
END $function$;
