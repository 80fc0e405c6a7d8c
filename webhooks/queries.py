"""Loads the named SQL in webhooks/sql/*.sql into QUERIES.

Each query starts with a `-- name: <query_name>` line; the comment lines right after it are
its documentation and stay part of the text. Parameters are always bound (`%(name)s`).
"""

from __future__ import annotations

import re
from pathlib import Path

SQL_DIR = Path(__file__).resolve().parent / "sql"
_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def queries_load(directory: Path) -> dict[str, str]:
    """Every named query in the directory's .sql files; a duplicate name is an error."""
    queries: dict[str, str] = {}
    for path in sorted(directory.glob("*.sql")):
        chunks = _NAME.split(path.read_text())
        # chunks = [preamble, name1, body1, name2, body2, ...]
        for name, body in zip(chunks[1::2], chunks[2::2], strict=True):
            if name in queries:
                raise ValueError(f"SQL query {name!r} is defined twice ({path.name})")
            queries[name] = body.strip().rstrip(";")
    return queries


QUERIES = queries_load(SQL_DIR)
