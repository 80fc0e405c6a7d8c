"""What a transaction has read of a table and its indexes, from PostgreSQL's own counters:
for tests that a statement reads by the index it should, and no more, whatever the plan."""

from __future__ import annotations

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
    """Pages of `tables` and of their indexes this transaction has asked for so far, read or
    found in shared buffers. A walk of an index counts every page it passes, where the entries
    `table_reads` counts are only those that matched."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT sum(pg_stat_get_xact_blocks_fetched(c.oid))
              FROM pg_class c
             WHERE c.oid = ANY (%(tables)s::regclass[])
                OR c.oid IN (SELECT indexrelid FROM pg_index
                              WHERE indrelid = ANY (%(tables)s::regclass[]))
            """,
            {"tables": list(tables)},
        )
        return cursor.fetchone()[0]


def pages_visited_by_relation() -> dict[str, int]:
    """`pages_visited` for every table and index of the service's schema, by name: what a
    statement read anywhere, its triggers' reads included."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT c.relname, pg_stat_get_xact_blocks_fetched(c.oid)
              FROM pg_class c
             WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'i')
            """
        )
        return dict(cursor.fetchall())
