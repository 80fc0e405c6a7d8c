-- The smallest UUIDv7 of a moment's millisecond: ids compare as their bytes, so every id
-- notifyqueue_uuid7() makes at or after `at` is >= this, every one made before is < it. The
-- history partitions' bounds (history_partition_add).
CREATE OR REPLACE FUNCTION notifyqueue_uuid7_floor(at timestamp with time zone)
 RETURNS uuid
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
    SELECT encode(substring(int8send(floor(extract(epoch FROM at) * 1000)::bigint) FROM 3)
                  || '\x00000000000000000000'::bytea, 'hex')::uuid
$function$;
