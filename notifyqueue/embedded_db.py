"""The embedded PostgreSQL for development and tests (never for production).

Only `python3 dev.py` (serve, test, bench) and processes started with the development switch
`NOTIFYQUEUE_DEV_EMBEDDED_DB=1` use it; settings never start a database on their own.

The server lives under ``.notifyqueue/pgdata`` in the project directory, listens only on a
Unix socket there (so it never competes for a TCP port), and keeps running after the process
that started it exits, so every later process (API, workers, tests) attaches to the same one.
`python3 dev.py stop` (or ``python -m notifyqueue.embedded_db stop``) stops it.

Its WAL is kept small (``EMBEDDED_SERVER_SETTINGS``): nothing replicates from it, so it needs
only minimal WAL, and frequent checkpoints let old segments be recycled. Durability settings
(fsync, synchronous_commit) are left at PostgreSQL's defaults so measurements stay honest.

Binaries come from the ``pgserver`` wheel (CPython <= 3.12), else from ``initdb``/``pg_ctl``
on PATH. This module must not import Django: settings call it before Django is configured.

    python -m notifyqueue.embedded_db start    # start (or attach); prints the DATABASE_URL
    python -m notifyqueue.embedded_db start --benchmark   # ... checkpoints spaced as by default
    python -m notifyqueue.embedded_db stop     # stop it if it runs
    python -m notifyqueue.embedded_db stop-if-idle   # ... and no client is connected
    python -m notifyqueue.embedded_db status   # the URL if it runs; exit 1 if not
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

DATABASE_NAME = "notifyqueue"
STATE_DIR = Path(__file__).resolve().parent.parent / ".notifyqueue"

# Applied with ALTER SYSTEM on every start; the server is restarted once when one of them
# needs it (wal_level, max_wal_senders). Measured: pg_wal held at 49 MB through a whole test
# suite (sampled every 3 s) and never above 65 MB; with PostgreSQL's default max_wal_size of
# 1 GB it had reached 353 MB.
EMBEDDED_SERVER_SETTINGS = {
    "wal_level": "minimal",
    "max_wal_senders": "0",
    "max_wal_size": "64MB",
    "min_wal_size": "32MB",
    "checkpoint_timeout": "60s",
    "wal_keep_size": "0",
}
# Of those, the ones PostgreSQL reads only at start.
RESTART_SETTINGS = ("wal_level", "max_wal_senders")
# `python3 dev.py bench` (`start --benchmark`): checkpoints as PostgreSQL's defaults space them,
# as on a production server. At 64 MB a drain of 20,000 rows forced a checkpoint every second
# or so, each followed by full-page images of every page written next, and four drains in a
# row slowed from 10,103/s to 6,149/s (9,423/s to 9,202/s with these). They stay until the
# next plain start or attach puts the ones above back.
BENCHMARK_SERVER_SETTINGS = {
    **EMBEDDED_SERVER_SETTINGS,
    "max_wal_size": "1GB",
    "min_wal_size": "80MB",
    "checkpoint_timeout": "5min",
}


class EmbeddedDatabaseUnavailable(RuntimeError):
    """No way to run PostgreSQL here; the message says what to install."""


def database_url(
    state_dir: Path = STATE_DIR, settings: dict[str, str] = EMBEDDED_SERVER_SETTINGS
) -> str:
    """Start (or attach to) the embedded server with `settings` and return a URL for the
    project database."""
    state_dir.mkdir(parents=True, exist_ok=True)
    try:
        server = _PgserverServer(state_dir / "pgdata")
    except ImportError:
        server = _PathBinariesServer(state_dir / "pgdata-system")
    base_url = server.start()
    if _apply_settings(base_url, settings):
        server.restart()
    _ensure_database(base_url)
    return base_url.replace("/postgres?", f"/{DATABASE_NAME}?", 1)


def is_running(state_dir: Path = STATE_DIR) -> bool:
    return any(_postmaster_alive(pgdata) for pgdata in _data_dirs(state_dir))


def stop(state_dir: Path = STATE_DIR, *, only_if_idle: bool = False) -> list[Path]:
    """Stops every embedded server under state_dir that runs; returns their data folders.

    only_if_idle: leave a server alone while any client is connected to it (another dev.py
    run in the same checkout is still using it).
    """
    stopped = []
    for pgdata in _data_dirs(state_dir):
        if not _postmaster_alive(pgdata):
            continue
        if only_if_idle and _clients_connected(pgdata):
            continue
        if pgdata.name == "pgdata":
            _PgserverServer.pg_ctl_stop(pgdata)
        else:
            _PathBinariesServer(pgdata).pg_ctl("-m", "fast", "-w", "stop")
        stopped.append(pgdata)
    return stopped


def _clients_connected(pgdata: Path) -> int:
    import psycopg

    # postmaster.pid: pid, data folder, start time, port, socket folder, ...
    lines = (pgdata / "postmaster.pid").read_text().split("\n")
    with psycopg.connect(
        host=lines[4], port=lines[3], user="postgres", dbname="postgres", autocommit=True
    ) as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
        ).fetchone()[0]


def _data_dirs(state_dir: Path) -> list[Path]:
    return [state_dir / "pgdata", state_dir / "pgdata-system"]


def _postmaster_alive(pgdata: Path) -> bool:
    try:
        pid = int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _PgserverServer:
    def __init__(self, pgdata: Path) -> None:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset; harmless for a socket under
            # pgdata.
            warnings.simplefilter("ignore")
            import pgserver
        self._pgserver = pgserver
        self.pgdata = pgdata
        self._server = None

    def start(self) -> str:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._server = self._pgserver.get_server(self.pgdata, cleanup_mode=None)
        return self._server.get_uri("postgres")

    def restart(self) -> None:
        # Without -o, pg_ctl restart reuses the options of the last start (the socket path).
        _pgserver_commands().pg_ctl(
            ["-w", "-m", "fast", "restart"], pgdata=self.pgdata, user=self._server.system_user
        )

    @staticmethod
    def pg_ctl_stop(pgdata: Path) -> None:
        # pgserver runs the server as its own 'pgserver' account when started by root.
        user = "pgserver" if os.geteuid() == 0 else None
        _pgserver_commands().pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=user)


def _pgserver_commands():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pgserver import _commands
    return _commands


class _PathBinariesServer:
    def __init__(self, pgdata: Path) -> None:
        self.pgdata = pgdata
        self.initdb, self.pg_ctl_path = shutil.which("initdb"), shutil.which("pg_ctl")
        if not (self.initdb and self.pg_ctl_path):
            raise EmbeddedDatabaseUnavailable(
                "No embedded PostgreSQL: the 'pgserver' wheel is not installed for this Python "
                "(it exists for CPython 3.11-3.12) and initdb/pg_ctl are not on PATH. Install "
                "PostgreSQL's server binaries (e.g. 'apt install postgresql' and add "
                "/usr/lib/postgresql/<version>/bin to PATH), use Python 3.11 or 3.12, or set "
                "DATABASE_URL to an existing PostgreSQL server."
            )
        self.run_as: list[str] = []
        if os.geteuid() == 0:
            # PostgreSQL refuses to run as root; use the account Debian's packages create.
            try:
                self.owner = pwd.getpwnam("postgres")
            except KeyError as exc:
                raise EmbeddedDatabaseUnavailable(
                    "Running as root needs a 'postgres' system user to own the embedded server."
                ) from exc
            self.run_as = ["runuser", "-u", "postgres", "--"]

    def pg_ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*self.run_as, self.pg_ctl_path, "-D", str(self.pgdata), *args],
            check=check,
            capture_output=True,
        )

    def start(self) -> str:
        if self.run_as:
            self.pgdata.mkdir(parents=True, exist_ok=True)
            os.chown(self.pgdata, self.owner.pw_uid, self.owner.pw_gid)
        if not (self.pgdata / "PG_VERSION").exists():
            subprocess.run(
                [
                    *self.run_as,
                    self.initdb,
                    "-D",
                    str(self.pgdata),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                ],
                check=True,
                capture_output=True,
            )
        if self.pg_ctl("status", check=False).returncode != 0:
            self.pg_ctl(
                "-w",
                "-l",
                str(self.pgdata / "server.log"),
                "-o",
                f"-h '' -k {self.pgdata}",
                "start",
            )
        return f"postgresql://postgres:@/postgres?host={self.pgdata}"

    def restart(self) -> None:
        self.pg_ctl("-w", "-m", "fast", "restart")


def _apply_settings(base_url: str, settings: dict[str, str]) -> bool:
    """Writes `settings`; True when the server must restart to apply them."""
    import psycopg

    with psycopg.connect(base_url, autocommit=True) as conn:
        current = dict(
            conn.execute(
                "SELECT name, setting || coalesce(unit, '') FROM pg_settings WHERE name = ANY(%s)",
                (list(settings),),
            ).fetchall()
        )
        wanted = {name: _normalised(value) for name, value in settings.items()}
        current = {name: _normalised(value) for name, value in current.items()}
        if all(current.get(name) == value for name, value in wanted.items()):
            return False
        for name, value in settings.items():
            # Names and values are this module's constants, not input.
            conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
        conn.execute("SELECT pg_reload_conf()")
    return any(current.get(name) != wanted[name] for name in RESTART_SETTINGS)


def _normalised(value: str) -> str:
    units = {"kB": 1024, "MB": 1024**2, "GB": 1024**3, "s": 1, "min": 60, "ms": 0.001}
    for unit, factor in units.items():
        if value.endswith(unit) and value[: -len(unit)].isdigit():
            return str(int(value[: -len(unit)]) * factor)
    return value


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


def main(argv: list[str]) -> int:
    command = argv[1] if len(argv) > 1 else ""
    if command == "start" and argv[2:] in ([], ["--benchmark"]):
        benchmark = argv[2:] == ["--benchmark"]
        settings = BENCHMARK_SERVER_SETTINGS if benchmark else EMBEDDED_SERVER_SETTINGS
        try:
            print(database_url(settings=settings))
        except EmbeddedDatabaseUnavailable as exc:
            print(exc, file=sys.stderr)
            return 1
        return 0
    if command in {"stop", "stop-if-idle"}:
        for pgdata in stop(only_if_idle=command == "stop-if-idle"):
            print(f"stopped the embedded PostgreSQL in {pgdata}")
        return 0
    if command == "status":
        return 0 if is_running() else 1
    print(__doc__.strip().rsplit("\n\n", 1)[-1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
