"""The database's code has one current home: each function, trigger and view the product defines
is one file (`<app>/sql/functions/<name>.sql`, `<app>/sql/views/<name>.sql`), and the file is
what PostgreSQL runs. The files are compared with a database migrated from scratch (the test
database), by creating each file again in a scratch schema, inside this test's transaction
(rolled back), and comparing PostgreSQL's own rendering of both (pg_get_functiondef,
pg_get_triggerdef, pg_get_viewdef): any formatting of a file is fine, but not a different
text of a body, a different SET clause or a missing trigger.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.recorder import MigrationRecorder

from notifyqueue.sqlfile import PROJECT

PROJECT_PACKAGES = {path.parent.name for path in PROJECT.glob("*/apps.py")}

pytestmark = pytest.mark.django_db

SCRATCH = "object_file_check"
_TRIGGER = re.compile(r"CREATE\s+(?:OR\s+REPLACE\s+)?TRIGGER\s+(\w+)", re.IGNORECASE)


def object_files(kind: str) -> dict[str, Path]:
    """Every `<app>/sql/<kind>/<name>.sql` (an app may be nested: delivery/circuits), by name."""
    files: dict[str, Path] = {}
    for pattern in (f"*/sql/{kind}/*.sql", f"*/*/sql/{kind}/*.sql"):
        for path in PROJECT.glob(pattern):
            relative = path.relative_to(PROJECT)
            if relative.parts[0].startswith(".") or relative.parts[0] in {"tests", "bench"}:
                continue
            assert path.stem not in files, f"{path.stem} has two files: {files[path.stem]}, {path}"
            files[path.stem] = path
    return files


def database_objects(schema: str) -> dict[str, dict[str, str]]:
    """The functions, triggers and views in `schema`, each as PostgreSQL renders it, with the
    schemas' names taken out (so a scratch copy reads as the original)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT p.proname, pg_get_functiondef(p.oid)
            FROM pg_proc AS p JOIN pg_namespace AS s ON s.oid = p.pronamespace
            WHERE s.nspname = %(schema)s
              AND NOT EXISTS (SELECT 1 FROM pg_depend AS d
                              WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid
                                AND d.deptype = 'e')
            """,
            {"schema": schema},
        )
        functions = dict(cursor.fetchall())
        cursor.execute(
            """
            SELECT t.tgname, pg_get_triggerdef(t.oid)
            FROM pg_trigger AS t JOIN pg_proc AS p ON p.oid = t.tgfoid
            JOIN pg_namespace AS s ON s.oid = p.pronamespace
            WHERE NOT t.tgisinternal AND t.tgparentid = 0 AND s.nspname = %(schema)s
            """,
            {"schema": schema},
        )
        triggers = dict(cursor.fetchall())
        cursor.execute(
            """
            SELECT c.relname, pg_get_viewdef(c.oid)
            FROM pg_class AS c JOIN pg_namespace AS s ON s.oid = c.relnamespace
            WHERE c.relkind = 'v' AND s.nspname = %(schema)s
            """,
            {"schema": schema},
        )
        views = dict(cursor.fetchall())
    return {
        kind: {
            name: text.replace(f"{SCRATCH}.", "").replace("public.", "")
            for name, text in objects.items()
        }
        for kind, objects in (("functions", functions), ("triggers", triggers), ("views", views))
    }


def test_every_function_trigger_and_view_has_one_file_and_every_file_an_object():
    in_database = database_objects("public")
    functions, views = object_files("functions"), object_files("views")
    triggers = {
        name: path for path in functions.values() for name in _TRIGGER.findall(path.read_text())
    }
    assert sorted(in_database["functions"]) == sorted(functions)
    assert sorted(in_database["triggers"]) == sorted(triggers)
    assert sorted(in_database["views"]) == sorted(views)


def test_what_postgresql_runs_is_what_the_files_say():
    migrated = database_objects("public")
    files = [*object_files("functions").values(), *object_files("views").values()]
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE SCHEMA {SCRATCH}")
        # New functions and views go to the scratch schema; the tables they name are found in
        # public. A file's triggers replace the real ones (this transaction only), calling the
        # scratch copy of their function.
        cursor.execute(f"SET LOCAL search_path = {SCRATCH}, public")
        for path in files:
            cursor.execute(path.read_text())
        from_files = database_objects(SCRATCH)
        cursor.execute("SET LOCAL search_path = public")
    for kind in ("functions", "views"):
        for name, text in migrated[kind].items():
            assert from_files[kind][name] == text, f"{name}: the database differs from its file"
    assert from_files["triggers"] == migrated["triggers"]


def test_a_database_migrated_before_the_squash_applies_only_what_came_after_it():
    """A database whose history names the migrations the squashed ones replace (and the
    squashed ones' own names, which the first of each app kept) counts the squashed set as
    applied: `migrate` neither skips nor repeats anything, and runs only the migrations added
    since (which replace nothing)."""
    executor = MigrationExecutor(connection)
    project = {
        key: migration
        for key, migration in executor.loader.disk_migrations.items()
        if type(migration).__module__.split(".")[0] in PROJECT_PACKAGES
    }
    squashed = {key for key, m in project.items() if m.replaces or key[1].startswith("0001_")}
    recorder = MigrationRecorder(connection)
    recorder.migration_qs.filter(app__in={app for app, _ in project}).delete()
    for (app, name), migration in project.items():
        if (app, name) in squashed:
            for old_app, old_name in migration.replaces:
                recorder.record_applied(old_app, old_name)
            if name.startswith("0001_"):
                recorder.record_applied(app, name)

    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    assert {(m.app_label, m.name) for m, _ in plan} == set(project) - squashed
    for key in squashed:
        assert key in executor.loader.applied_migrations, key
