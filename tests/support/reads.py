"""What a transaction has read of a table and its indexes, from PostgreSQL's own counters:
for tests that a statement reads by the index it should, and no more, whatever the plan."""

from __future__ import annotations

import re
import time

from django.db import connection

Reads = dict[str, tuple[int, int]]


def table_reads(table: str) -> Reads:
    """What this transaction has read of `table` so far: for the table, (sequential scans, rows
    they returned); for each of its indexes, (scans, entries they returned). Compare two
    readings taken in one transaction (the counters are the transaction's)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT c.relname, pg_stat_get_xact_numscans(c.oid),
                   pg_stat_get_xact_tuples_returned(c.oid)
              FROM pg_class c
             WHERE c.oid = %(table)s::regclass
                OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = %(table)s::regclass)
            """,
            {"table": table},
        )
        return {name: (scans, returned) for name, scans, returned in cursor.fetchall()}


def table_reads_since(table: str, before: Reads) -> Reads:
    """The relations of `table` read since `before` (a `table_reads` of this transaction),
    with their scans and rows or entries returned since."""
    now = table_reads(table)
    return {
        name: (scans - before[name][0], returned - before[name][1])
        for name, (scans, returned) in now.items()
        if (scans, returned) != before[name]
    }


def pages_visited(tables: tuple[str, ...]) -> int:
    """Pages of `tables` (each partition of a partitioned one) and of their indexes this
    transaction has asked for so far, read or found in shared buffers. A walk of an index
    counts every page it passes, where the entries `table_reads` counts are only those that
    matched."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            WITH relations AS (
                SELECT unnest(%(tables)s::regclass[]) AS relid
                UNION
                SELECT tree.relid
                  FROM unnest(%(tables)s::regclass[]) AS t(relid)
                 CROSS JOIN LATERAL pg_partition_tree(t.relid) AS tree
            )
            SELECT sum(pg_stat_get_xact_blocks_fetched(c.oid))
              FROM pg_class c
             WHERE c.oid IN (SELECT relid FROM relations)
                OR c.oid IN (SELECT indexrelid FROM pg_index
                              WHERE indrelid IN (SELECT relid FROM relations))
            """,
            {"tables": list(tables)},
        )
        return cursor.fetchone()[0]


def pages_visited_by_relation() -> dict[str, int]:
    """`pages_visited` for every table and index of the service's schema, by name: what a
    statement read anywhere, its triggers' reads included. A partition's pages count under
    its partitioned table's name, and its indexes' under the partitioned index's."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT coalesce(parent.relname, c.relname),
                   sum(pg_stat_get_xact_blocks_fetched(c.oid))::bigint
              FROM pg_class AS c
              LEFT JOIN pg_inherits AS h ON h.inhrelid = c.oid
              LEFT JOIN pg_class AS parent ON parent.oid = h.inhparent
             WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'i')
             GROUP BY 1
            """
        )
        return dict(cursor.fetchall())


def vacuum_after_every_snapshot(table: str, *, analyze: bool = False, wait_s: float = 60.0) -> None:
    """VACUUM (ANALYZE) `table` once no other session holds a snapshot older than the changes
    committed so far: a snapshot taken before them (autovacuum's ANALYZE of a table just filled,
    another test's connection left in a transaction) keeps their old row versions, and so their
    index entries, which the claims then step over as they would in production until the next
    VACUUM. Waits at most `wait_s`, then vacuums anyway, so that a failure shows what was left."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_xact_id()::xid::text")  # after everything committed
        [changes] = cursor.fetchone()
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
                "AND (age(backend_xmin) >= age(%(x)s::xid) OR age(backend_xid) >= age(%(x)s::xid))",
                {"x": changes},
            )
            if cursor.fetchone()[0] == 0:
                break
            time.sleep(0.05)
        cursor.execute(f"VACUUM {'ANALYZE ' if analyze else ''}{connection.ops.quote_name(table)}")


def history_read_whole(plan: str) -> list[str]:
    """The partitions of `notification` that an EXPLAIN text reads by a sequential scan and
    that hold rows. An empty partition (a week ahead, the default one) costs the planner
    nothing to scan, so it may; one holding rows never."""
    scanned = set(re.findall(r"Seq Scan on (notification_(?:\d{8}|default))\b", plan))
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name FROM unnest(%s::text[]) AS name "
            "WHERE pg_relation_size(name::regclass) > 0 ORDER BY name",
            [sorted(scanned)],
        )
        return [name for (name,) in cursor.fetchall()]


# Pages a statement on the record planned for a call reads of each partition's indexes (their
# first pages), beyond the one partition a row lives in: 33-36 measured, one week's partition
# and a default one empty (docs/decisions/0021-weekly-history-partitions.md).
PLANNING_PAGES_PER_PARTITION = 40


def planning_pages_of_partitions(table: str = "notification") -> int:
    """What planning reads of `table`'s partitions but one (PLANNING_PAGES_PER_PARTITION each)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_partition_tree(%s::regclass) WHERE isleaf", [table])
        (partitions,) = cursor.fetchone()
    return PLANNING_PAGES_PER_PARTITION * max(partitions - 1, 0)
