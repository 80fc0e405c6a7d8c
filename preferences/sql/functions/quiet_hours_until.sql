-- Until when quiet hours hold a message on p_channel at p_now: the instant the last of the
-- windows it falls in ends, or NULL when it falls in none. p_windows is a user's `quiet_hours`
-- ([{"start": "22:00", "end": "07:30", "channels": [...]}], local wall-clock times in zone
-- p_zone; a window whose start is later than its end crosses midnight; "channels" left out
-- means every channel). Whether a moment is quiet is read from the wall clock then: the local
-- time from start up to, not including, end. A window that ends where another begins holds on
-- into that one (at most one round per window, so windows that cover the whole day give the
-- last end found, checked again then). Times come from PostgreSQL's time zone database alone.
CREATE OR REPLACE FUNCTION quiet_hours_until(p_now timestamptz, p_zone text, p_windows jsonb, p_channel text)
 RETURNS timestamptz
 LANGUAGE plpgsql
 STABLE
AS $function$
DECLARE
    at timestamptz := p_now;
    wall timestamp;
    ends timestamptz;
    edge timestamp;
    w jsonb;
    starts_at time;
    ends_at time;
    quiet boolean := false;
BEGIN
    IF p_windows IS NULL OR jsonb_typeof(p_windows) <> 'array' OR jsonb_array_length(p_windows) = 0 THEN
        RETURN NULL;
    END IF;
    FOR round IN 1 .. jsonb_array_length(p_windows) LOOP
        wall := at AT TIME ZONE p_zone;
        ends := NULL;
        FOR w IN SELECT value FROM jsonb_array_elements(p_windows) LOOP
            CONTINUE WHEN jsonb_typeof(w -> 'channels') = 'array' AND NOT (w -> 'channels') ? p_channel;
            starts_at := (w ->> 'start')::time;
            ends_at := (w ->> 'end')::time;
            edge := CASE
                WHEN starts_at < ends_at AND wall::time >= starts_at AND wall::time < ends_at
                    THEN wall::date + ends_at
                WHEN starts_at > ends_at AND wall::time >= starts_at
                    THEN (wall::date + 1) + ends_at
                WHEN starts_at > ends_at AND wall::time < ends_at
                    THEN wall::date + ends_at
            END;
            IF edge IS NOT NULL THEN
                ends := greatest(ends, quiet_hours_wall_instant(edge, p_zone, at));
            END IF;
        END LOOP;
        EXIT WHEN ends IS NULL OR ends <= at;
        at := ends;
        quiet := true;
    END LOOP;
    RETURN CASE WHEN quiet THEN at END;
END $function$;
