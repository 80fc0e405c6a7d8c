-- What the admin's paginator reads instead of counting a table: planner statistics only.

-- name: table_row_estimate
-- The planner's row estimate for a table (kept by ANALYZE and autovacuum), for admin lists
-- that must not COUNT(*) millions of rows. -1 means the table was never analysed.
SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%(table)s);
