"""SQL follows the same one-way order as the Python (pyproject.toml, [tool.importlinter]): an
app's SQL files name only its own tables and those of the apps below it; a higher app's tables
are reached through a function or view that the higher app owns (docs/technical-design.md,
"The database's code").

A table is named when its name stands as a word in the SQL with the comments taken out; a
function is called by name, so calling a higher app's function is not a crossing.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from django.apps import apps

from notifyqueue.sqlfile import PROJECT


def layers() -> dict[str, int]:
    """Each top-level package's layer, 0 the lowest; `a | b` share one."""
    config = tomllib.loads((PROJECT / "pyproject.toml").read_text())
    contract = config["tool"]["importlinter"]["contracts"][0]
    ranks: dict[str, int] = {}
    for rank, layer in enumerate(reversed(contract["layers"])):
        for package in layer.split("|"):
            ranks[package.strip()] = rank
    return ranks


def table_owners() -> dict[str, str]:
    return {
        model._meta.db_table: model.__module__.split(".")[0]
        for model in apps.get_models()
        if model.__module__.split(".")[0] in layers()
    }


def sql_files() -> list[Path]:
    return sorted(
        path
        for path in PROJECT.glob("**/sql/**/*.sql")
        if path.relative_to(PROJECT).parts[0] in layers()
    )


def tables_named(path: Path, tables: set[str]) -> set[str]:
    text = re.sub(r"--[^\n]*", "", path.read_text())
    return {table for table in tables if re.search(rf"\b{table}\b", text)}


def test_sql_reads_and_writes_only_its_own_and_lower_apps_tables():
    ranks, owners = layers(), table_owners()
    crossings = {}
    for path in sql_files():
        app = path.relative_to(PROJECT).parts[0]
        higher = {
            table
            for table in tables_named(path, set(owners))
            if owners[table] != app and ranks[owners[table]] >= ranks[app]
        }
        if higher:
            crossings[str(path.relative_to(PROJECT))] = higher
    assert crossings == {}
