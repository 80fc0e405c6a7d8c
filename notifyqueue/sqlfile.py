"""Loads the project's SQL from files: named queries, and the database's own objects.

Named queries: a file holds several statements, each introduced by a header line
`-- name: <query_name>`; everything up to the next header is that query's text. Parameters are
psycopg placeholders (`%(name)s`) and are always bound, never formatted in.

Database objects: each function, trigger function (with its triggers) and view the product
defines is one file named after it, `<app>/sql/functions/<name>.sql` or
`<app>/sql/views/<name>.sql`, in the app whose tables it writes. The file is the object's one
current text; migrations run it (`database_objects_create`, `database_objects_reload`), and
tests/integration/test_database_objects.py compares it with what PostgreSQL runs.
"""

from __future__ import annotations

import re
from pathlib import Path

from django.db import migrations

_HEADER = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)

# The folder that holds the apps; object files are named relative to it.
PROJECT = Path(__file__).resolve().parent.parent
OBJECT_KINDS = {"functions": "FUNCTION", "views": "VIEW"}


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


def database_object_path(file: str) -> Path:
    """The path of an object's file, given as `<app>/sql/<kind>/<name>.sql`."""
    path = PROJECT / file
    if path.parent.name not in OBJECT_KINDS or path.parent.parent.name != "sql":
        raise ValueError(f"{file}: not an object file (<app>/sql/functions|views/<name>.sql)")
    return path


def database_objects_create(*files: str) -> migrations.RunSQL:
    """A migration step that creates each object from its file, in the order given (an object
    another one's definition names comes first); reversed, it drops them (a function's
    triggers with it)."""
    paths = [database_object_path(file) for file in files]
    return migrations.RunSQL(
        "\n".join(path.read_text() for path in paths),
        reverse_sql="\n".join(
            f"DROP {OBJECT_KINDS[path.parent.name]} IF EXISTS {path.stem} CASCADE;"
            for path in reversed(paths)
        ),
    )


def database_objects_reload(*files: str) -> migrations.RunSQL:
    """A migration step that makes each object what its file says now (CREATE OR REPLACE);
    the files' earlier text is in git, so it is not reversed."""
    paths = [database_object_path(file) for file in files]
    return migrations.RunSQL(
        "\n".join(path.read_text() for path in paths), reverse_sql=migrations.RunSQL.noop
    )
