"""The backlog count reads the client's index entries, never the whole queue.

The create's backlog check counts a client's PENDING rows up to the limit
(`client_pending_count`), by the client's entries in `queue_client_status` in that index's
order, stopping at the limit. After a burst has drained, that index keeps its pages (15,173
after the benchmark's 1,000,000-row backlog) around a handful of live entries, and the queue
its pages (migration 0018). PostgreSQL spreads an index's pages over the entries it thinks the
index holds: with a few left, the look-up of one client's entries was priced at thousands of
pages, and from 2 rows up in the planner's count for the queue the count sorted a read of the
whole queue instead (32 ms at that size), at most every 2 s per client and API process
(`ClientBacklog`).

The count is now a function run with `enable_seqscan` and `enable_bitmapscan` off, so it walks
the index and stops at the limit whatever the figures. It is planned at each call for the
client it counts (`force_custom_plan`; under a millisecond, once per recount): a plan made for
any client, as a SQL function's is, walked `queue_status` (every client's waiting rows, newest
first) and filtered on the client in the full suite's plan test.
"""

from django.db import migrations

FUNCTION = """
CREATE FUNCTION notification_client_pending_count(p_client_id uuid, p_limit integer)
RETURNS bigint
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
SET enable_bitmapscan = off
SET plan_cache_mode = force_custom_plan
AS $$
BEGIN
    RETURN (
        SELECT count(*) FROM (
            SELECT 1
              FROM notification_queue
             WHERE client_id = p_client_id
               AND status = 'PENDING'
             ORDER BY created_at DESC, id DESC
             LIMIT p_limit
        ) AS pending
    );
END
$$;
"""


class Migration(migrations.Migration):
    dependencies = [("notifications", "0019_queue_triggers_find_rows_by_key")]

    operations = [
        migrations.RunSQL(
            FUNCTION,
            reverse_sql="DROP FUNCTION notification_client_pending_count(uuid, integer);",
        ),
    ]
