-- Time-ordered ids (UUIDv7) stamped with the database clock: new rows land at the right edge
-- of the primary key's index instead of on random pages of it, and a row's id tells the week
-- of its creation, which is how the history tables are partitioned (history_partition_add).
-- Rows made in one statement share the millisecond; the random bits order them.
CREATE OR REPLACE FUNCTION notifyqueue_uuid7()
 RETURNS uuid
 LANGUAGE sql
 PARALLEL SAFE
AS $function$
    SELECT encode(
        set_bit(
            set_bit(
                overlay(uuid_send(gen_random_uuid())
                        PLACING substring(int8send(floor(extract(epoch FROM notifyqueue_now())
                                                         * 1000)::bigint) FROM 3)
                        FROM 1 FOR 6),
                52, 1),
            53, 1),
        'hex')::uuid
$function$;
