"""The queue triggers find the rows they delete by primary key, never by reading the table.

`notification_queue_updated` and `notification_queue_deleted` delete queue rows by id
(`id = ANY (ARRAY(SELECT id FROM <transition table>))`), the first on every claim and every
finish. After a burst has drained, the queue keeps its pages (migration 0018) and its primary
key its pages, around a handful of live rows. With the planner's row count for the queue
between 2 and about 7, which the worker's own ANALYZE records between the creates of a steady
trickle, PostgreSQL priced the look-up of a few ids in that key (its pages divided among the
rows it thinks are there) above a read of the whole table, and took the read: 32-95 ms a
claim or finish with the 113 MB left by a 1,000,000-row backlog, latency p99 309 ms at 200
creates a second (docs/performance.md, "Sixteenth round"). The plan is kept for the
connection, so setting this on the caller (the finish function has it) did not reach it.

Run with `enable_seqscan` off, the triggers' statements take the key whatever the figures:
every statement in them looks rows up by id. A statement marking 60,000 rows SENT at once took
0.46 s with it (0.58 s without), on the same bloated queue.
"""

from django.db import migrations

FUNCTIONS = ("notification_queue_updated()", "notification_queue_deleted()")


class Migration(migrations.Migration):
    dependencies = [("notifications", "0018_queue_not_truncated_by_vacuum")]

    operations = [
        migrations.RunSQL(
            "\n".join(f"ALTER FUNCTION {f} SET enable_seqscan = off;" for f in FUNCTIONS),
            reverse_sql="\n".join(f"ALTER FUNCTION {f} RESET enable_seqscan;" for f in FUNCTIONS),
        ),
    ]
