-- The first instant at or after p_after at which the wall clock of zone p_zone shows p_local or
-- a later time: when a quiet-hours window that ends at p_local really ends. PostgreSQL's own
-- reading of a local time (p_local AT TIME ZONE p_zone) is not that instant on the days the
-- clocks change: a time the clocks skip (02:30 when 02:00 becomes 03:00) it reads with the
-- offset before the change, an hour late (03:30); a time the clocks show twice (01:30 when
-- 02:00 becomes 01:00) it reads as the second showing. So each offset the zone has within a
-- day either side gives a candidate, a candidate counts only if the clock shows p_local then,
-- and the earliest at or after p_after is the answer; when the clocks skip p_local, no
-- candidate counts and the answer is the moment of the change (found to the second, in at
-- most 17 halvings of the skipped span, which is at most a day). Every time zone rule comes
-- from PostgreSQL's time zone database.
CREATE OR REPLACE FUNCTION quiet_hours_wall_instant(p_local timestamp, p_zone text, p_after timestamptz)
 RETURNS timestamptz
 LANGUAGE plpgsql
 STABLE
AS $function$
DECLARE
    read timestamptz := p_local AT TIME ZONE p_zone;
    offsets interval[];
    found timestamptz;
    low timestamptz;
    high timestamptz;
    step bigint;
    middle timestamptz;
BEGIN
    SELECT array_agg(DISTINCT (x AT TIME ZONE p_zone) - (x AT TIME ZONE 'UTC'))
      INTO offsets
      FROM unnest(ARRAY[read - interval '1 day', read, read + interval '1 day']) AS x;
    SELECT min(c.at) INTO found
      FROM (SELECT (p_local - o) AT TIME ZONE 'UTC' AS at FROM unnest(offsets) AS o) AS c
     WHERE c.at AT TIME ZONE p_zone = p_local AND c.at >= p_after;
    IF found IS NOT NULL THEN
        RETURN found;
    END IF;
    -- Skipped: before the change the clock shows less than p_local, after it more.
    SELECT min((p_local - o) AT TIME ZONE 'UTC'), max((p_local - o) AT TIME ZONE 'UTC')
      INTO low, high
      FROM unnest(offsets) AS o;
    IF low AT TIME ZONE p_zone >= p_local OR high AT TIME ZONE p_zone < p_local THEN
        -- Not a skipped time either (a zone whose rules change twice in a day): PostgreSQL's
        -- own reading, never before p_after.
        RETURN greatest(read, p_after);
    END IF;
    WHILE high - low > interval '1 second' LOOP
        step := floor(extract(epoch FROM high - low) / 2);
        middle := low + make_interval(secs => step);
        IF middle AT TIME ZONE p_zone >= p_local THEN
            high := middle;
        ELSE
            low := middle;
        END IF;
    END LOOP;
    RETURN greatest(high, p_after);
END $function$;
