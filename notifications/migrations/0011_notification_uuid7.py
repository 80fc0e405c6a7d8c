"""`notifyqueue_uuid7()`: notification ids ordered by creation time (UUID version 7).

The first 48 bits are the Unix time in milliseconds (the server's real clock, not
notifyqueue_now(): an id only needs to grow, and a test's frozen clock must not make ids
collide), the rest random, with the version and variant bits of RFC 9562. New rows' ids then
sit together at the right edge of the primary key and of every foreign key that refers to them,
instead of at random places in an index of millions: a claim's and a finish's look-ups by id,
and the foreign-key checks of the attempt and rate-limit rows, stay in cached pages however
large the history grows.
"""

from django.db import migrations

FUNCTION = """
CREATE FUNCTION notifyqueue_uuid7() RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT encode(
        set_bit(
            set_bit(
                overlay(uuid_send(gen_random_uuid())
                        PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp())
                                                         * 1000)::bigint) FROM 3)
                        FROM 1 FOR 6),
                52, 1),
            53, 1),
        'hex')::uuid
$$;
"""


class Migration(migrations.Migration):
    dependencies = [("notifications", "0010_record_fillfactor_50")]

    operations = [
        migrations.RunSQL(FUNCTION, reverse_sql="DROP FUNCTION notifyqueue_uuid7();"),
    ]
