"""The embedded PostgreSQL used when ``DATABASE_URL`` is unset.

The server lives under ``.notifyqueue/pgdata`` in the project directory, listens only on a
Unix socket there (so it never competes for a TCP port), and keeps running after the process
that started it exits: every later process (API, workers, tests) attaches to the same one.

Binaries come from the ``pgserver`` wheel (CPython <= 3.12), else from ``initdb``/``pg_ctl``
on PATH. This module must not import Django: settings call it before Django is configured.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import warnings
from pathlib import Path

DATABASE_NAME = "notifyqueue"


class EmbeddedDatabaseUnavailable(RuntimeError):
    """No way to run PostgreSQL here; the message says what to install."""


def database_url(state_dir: Path) -> str:
    """Start (or attach to) the embedded server and return a URL for the project database."""
    state_dir.mkdir(parents=True, exist_ok=True)
    try:
        base_url = _start_with_pgserver(state_dir / "pgdata")
    except ImportError:
        base_url = _start_with_path_binaries(state_dir / "pgdata-system")
    _ensure_database(base_url)
    return base_url.replace("/postgres?", f"/{DATABASE_NAME}?", 1)


def _start_with_pgserver(pgdata: Path) -> str:
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset; harmless for a socket under pgdata.
        warnings.simplefilter("ignore")
        import pgserver

        server = pgserver.get_server(pgdata, cleanup_mode=None)
        return server.get_uri("postgres")


def _start_with_path_binaries(pgdata: Path) -> str:
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if not (initdb and pg_ctl):
        raise EmbeddedDatabaseUnavailable(
            "No embedded PostgreSQL: the 'pgserver' wheel is not installed for this Python "
            "(it exists for CPython 3.11-3.12) and initdb/pg_ctl are not on PATH. Install "
            "PostgreSQL's server binaries (e.g. 'apt install postgresql' and add "
            "/usr/lib/postgresql/<version>/bin to PATH), use Python 3.11 or 3.12, or set "
            "DATABASE_URL to an existing PostgreSQL server."
        )
    run_as: list[str] = []
    if os.geteuid() == 0:
        # PostgreSQL refuses to run as root; use the account Debian's packages create.
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError as exc:
            raise EmbeddedDatabaseUnavailable(
                "Running as root needs a 'postgres' system user to own the embedded server."
            ) from exc
        run_as = ["runuser", "-u", "postgres", "--"]
        pgdata.mkdir(parents=True, exist_ok=True)
        os.chown(pgdata, owner.pw_uid, owner.pw_gid)
    if not (pgdata / "PG_VERSION").exists():
        subprocess.run(
            [*run_as, initdb, "-D", str(pgdata), "-U", "postgres", "--auth=trust", "-E", "UTF8"],
            check=True,
            capture_output=True,
        )
    status = subprocess.run([*run_as, pg_ctl, "-D", str(pgdata), "status"], capture_output=True)
    if status.returncode != 0:
        subprocess.run(
            [
                *run_as,
                pg_ctl,
                "-D",
                str(pgdata),
                "-w",
                "-l",
                str(pgdata / "server.log"),
                "-o",
                f"-h '' -k {pgdata}",
                "start",
            ],
            check=True,
            capture_output=True,
        )
    return f"postgresql://postgres:@/postgres?host={pgdata}"


def _ensure_database(base_url: str) -> None:
    import psycopg

    with psycopg.connect(base_url, autocommit=True) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE_NAME,)
        ).fetchone()
        if not exists:
            # Another process may create it first; either way it exists afterwards.
            with contextlib.suppress(psycopg.errors.DuplicateDatabase):
                conn.execute(f'CREATE DATABASE "{DATABASE_NAME}"')
