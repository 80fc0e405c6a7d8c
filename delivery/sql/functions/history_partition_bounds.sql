-- A history partition's range of keys, [lo, hi), as its bound says (history_partition_add);
-- no row for the default partition.
CREATE OR REPLACE FUNCTION history_partition_bounds(p_partition regclass)
 RETURNS TABLE(lo uuid, hi uuid)
 LANGUAGE sql
 STABLE
AS $function$
    SELECT bounds[1]::uuid, bounds[2]::uuid
      FROM pg_class AS c
     CROSS JOIN LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid),
                                     $re$FROM \('([^']+)'\) TO \('([^']+)'\)$re$) AS bounds
     WHERE c.oid = p_partition AND bounds IS NOT NULL
$function$;
