-- Time-ordered ids (UUIDv7): new rows land at the right edge of the primary key's index
-- instead of on random pages of it, and a row's id tells the week of its creation by the
-- database clock, which is how the notification table is partitioned (history_partition_add).
-- The time is the moment of the call; but when that lies in another week than the database
-- clock (a statement that began before a week's start, or a clock that tests move), the
-- database clock's, so that an id's week is always its creation time's. (The weeks are
-- history_week's, spelled out: the first migrations load this file before that function exists.)
CREATE OR REPLACE FUNCTION notifyqueue_uuid7()
 RETURNS uuid
 LANGUAGE sql
 PARALLEL SAFE
AS $function$
    SELECT encode(
        set_bit(
            set_bit(
                overlay(uuid_send(gen_random_uuid())
                        PLACING substring(int8send(floor(extract(epoch FROM
                            CASE WHEN date_bin('7 days', clock_timestamp(), '2001-01-01 00:00:00+00')
                                      = date_bin('7 days', notifyqueue_now(), '2001-01-01 00:00:00+00')
                                   THEN clock_timestamp()
                                 ELSE notifyqueue_now() END) * 1000)::bigint) FROM 3)
                        FROM 1 FOR 6),
                52, 1),
            53, 1),
        'hex')::uuid
$function$;
