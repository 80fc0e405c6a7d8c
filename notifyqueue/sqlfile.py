"""Loads named SQL queries from a `.sql` file.

A file holds several statements, each introduced by a header line `-- name: <query_name>`;
everything up to the next header is that query's text. Parameters are psycopg placeholders
(`%(name)s`) and are always bound, never formatted in.
"""

from __future__ import annotations

import re
from pathlib import Path

_HEADER = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


def queries_load(path: Path) -> dict[str, str]:
    text = path.read_text()
    parts = _HEADER.split(text)
    # parts = [preamble, name1, body1, name2, body2, ...]
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"{path}: query {name!r} is defined twice")
        queries[name] = body.strip().rstrip(";")
    return queries
