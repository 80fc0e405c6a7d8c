"""The planner's row estimates, for admin lists that must not COUNT(*) millions of rows: the
only code that runs `monitoring/sql/estimates.sql`. It reads pg_class, no app's table."""

from __future__ import annotations

from pathlib import Path

from notifyqueue.sqlgateway import Queries

SQL = Queries(Path(__file__).with_name("sql") / "estimates.sql")


def table_row_estimate(table: str) -> int | None:
    """The planner's estimate of a table's rows; None before its first ANALYZE."""
    estimate = SQL.scalar("table_row_estimate", table=table)
    return None if estimate is None or estimate < 0 else estimate
