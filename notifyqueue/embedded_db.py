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

Binaries come from the ``pgserver`` wheel (CPython <= 3.12, PostgreSQL 16), else from
PostgreSQL's own ``initdb``/``pg_ctl``: on PATH, or the newest under ``/usr/lib/postgresql/*/bin``
(where Debian's packages put them, off PATH). ``--server system`` takes the second route even
where pgserver is installed, so the test suite runs it on every Python. This module must not
import Django: settings call it before Django is configured.

    python -m notifyqueue.embedded_db start    # start (or attach); prints the DATABASE_URL
    python -m notifyqueue.embedded_db start --benchmark   # ... checkpoints spaced as by default
    python -m notifyqueue.embedded_db stop     # stop it if it runs
    python -m notifyqueue.embedded_db stop-if-idle   # ... and no client is connected
    python -m notifyqueue.embedded_db status   # exit 0 if it runs, 1 if not

`start` and `stop` also take ``--state-dir DIR`` (instead of ``.notifyqueue/``) and `start`
takes ``--server system``.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

DATABASE_NAME = "notifyqueue"
STATE_DIR = Path(__file__).resolve().parent.parent / ".notifyqueue"
# Where Debian's PostgreSQL packages install the server's programs (not on PATH).
DEBIAN_BIN_DIRS = "/usr/lib/postgresql/*/bin"
# pg_ctl waits this long for a start, stop or restart (`-t`); a server that has not come up by
# then is an error, never a wait without end.
PG_CTL_TIMEOUT_S = 120

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
    state_dir: Path = STATE_DIR,
    settings: dict[str, str] = EMBEDDED_SERVER_SETTINGS,
    *,
    system_binaries: bool = False,
) -> str:
    """Start (or attach to) the embedded server with `settings` and return a URL for the
    project database. system_binaries: PostgreSQL's own programs even where pgserver is
    installed."""
    state_dir.mkdir(parents=True, exist_ok=True)
    try:
        if system_binaries:
            raise ImportError("PostgreSQL's own binaries asked for")
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
            _PathBinariesServer(pgdata).pg_ctl(
                "-m", "fast", "-w", "-t", str(PG_CTL_TIMEOUT_S), "stop"
            )
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


def postgres_bin_dir() -> Path | None:
    """The folder of PostgreSQL's own initdb and pg_ctl: PATH's, else the newest of Debian's."""
    on_path = shutil.which("pg_ctl")
    if on_path and shutil.which("initdb"):
        return Path(on_path).parent
    debian = [Path(d) for d in glob.glob(DEBIAN_BIN_DIRS) if (Path(d) / "initdb").exists()]
    if not debian:
        return None
    return max(debian, key=lambda d: int(d.parent.name) if d.parent.name.isdigit() else 0)


class _PathBinariesServer:
    def __init__(self, pgdata: Path) -> None:
        self.pgdata = pgdata
        bin_dir = postgres_bin_dir()
        if bin_dir is None:
            raise EmbeddedDatabaseUnavailable(
                "No embedded PostgreSQL: the 'pgserver' wheel is not installed for this Python "
                "(it exists for CPython 3.11-3.12), initdb/pg_ctl are not on PATH and none are "
                f"under {DEBIAN_BIN_DIRS}. Install PostgreSQL's server (e.g. 'apt-get install "
                "--no-install-recommends postgresql'), use Python 3.11 or 3.12, or set "
                "DATABASE_URL to an existing PostgreSQL server."
            )
        self.initdb, self.pg_ctl_path = str(bin_dir / "initdb"), str(bin_dir / "pg_ctl")
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
        return self._run([self.pg_ctl_path, "-D", str(self.pgdata), *args], check=check)

    def _run(self, command: list[str], *, check: bool) -> subprocess.CompletedProcess:
        """Runs one of PostgreSQL's programs with its output in files, never in pipes: a
        server that pg_ctl starts inherits them, and a pipe held open by the server would make
        reading it wait for as long as the server runs."""
        with tempfile.TemporaryFile() as out:
            done = subprocess.run(
                [*self.run_as, *command], stdin=subprocess.DEVNULL, stdout=out, stderr=out
            )
            out.seek(0)
            done.stdout = out.read().decode(errors="replace")
        if check and done.returncode != 0:
            raise EmbeddedDatabaseUnavailable(
                f"{' '.join(command)} failed (exit {done.returncode}):\n{done.stdout.strip()}"
            )
        return done

    def start(self) -> str:
        if self.run_as:
            self.pgdata.mkdir(parents=True, exist_ok=True)
            os.chown(self.pgdata, self.owner.pw_uid, self.owner.pw_gid)
        if not (self.pgdata / "PG_VERSION").exists():
            self._run(
                [
                    *(self.initdb, "-D", str(self.pgdata), "-U", "postgres"),
                    *("--auth=trust", "-E", "UTF8"),
                ],
                check=True,
            )
        if self.pg_ctl("status", check=False).returncode != 0:
            self.pg_ctl(*self._start_options(), "start")
        return f"postgresql://postgres:@/postgres?host={self.pgdata}"

    def restart(self) -> None:
        self.pg_ctl(*self._start_options(), "-m", "fast", "restart")

    def _start_options(self) -> list[str]:
        # The server's own output goes to a log file in its data folder (-l); it listens only
        # on a socket there (-o).
        return [
            *("-w", "-t", str(PG_CTL_TIMEOUT_S), "-l", str(self.pgdata / "server.log")),
            *("-o", f"-h '' -k {self.pgdata}"),
        ]


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
    options = _options(argv[2:], allowed=COMMAND_OPTIONS.get(command, set()))
    if options is None:
        print("\n\n".join(__doc__.strip().split("\n\n")[-2:]), file=sys.stderr)
        return 2
    state_dir = Path(options.get("--state-dir", STATE_DIR))
    if command == "start":
        benchmark = "--benchmark" in options
        settings = BENCHMARK_SERVER_SETTINGS if benchmark else EMBEDDED_SERVER_SETTINGS
        try:
            url = database_url(
                state_dir, settings, system_binaries=options.get("--server") == "system"
            )
        except EmbeddedDatabaseUnavailable as exc:
            print(exc, file=sys.stderr)
            return 1
        print(url)
        return 0
    if command in {"stop", "stop-if-idle"}:
        for pgdata in stop(state_dir, only_if_idle=command == "stop-if-idle"):
            print(f"stopped the embedded PostgreSQL in {pgdata}")
        return 0
    return 0 if is_running(state_dir) else 1


# Each command's options; a flag's value is True, the others take the next argument.
COMMAND_OPTIONS = {
    "start": {"--benchmark", "--state-dir", "--server"},
    "stop": {"--state-dir"},
    "stop-if-idle": {"--state-dir"},
    "status": {"--state-dir"},
}
FLAGS = {"--benchmark"}
CHOICES = {"--server": {"system"}}


def _options(args: list[str], *, allowed: set[str]) -> dict[str, str] | None:
    """`args` as {option: value}, or None when one is unknown, lacks its value or repeats."""
    if not allowed:
        return None
    options: dict[str, str] = {}
    rest = list(args)
    while rest:
        name = rest.pop(0)
        if name not in allowed or name in options:
            return None
        if name in FLAGS:
            options[name] = "yes"
            continue
        if not rest or rest[0].startswith("--"):
            return None
        options[name] = rest.pop(0)
        if name in CHOICES and options[name] not in CHOICES[name]:
            return None
    return options


if __name__ == "__main__":
    sys.exit(main(sys.argv))
