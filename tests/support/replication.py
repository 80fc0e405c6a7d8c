"""A primary and a streaming standby of their own, built in a temporary folder for a failover
test: PostgreSQL's own programs (initdb, pg_ctl, pg_basebackup) from the pgserver wheel or
Debian's packages, trust authentication on 127.0.0.1, free ports, a physical replication slot.

The standby reaches the primary through `ReplicationLink`, a TCP relay in the test process that
can hold the WAL stream: what a slow network or a busy standby does to asynchronous
replication, made to happen at a moment the test chooses.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg

from tests.support.gunicorn_server import free_port

ROOT = Path(__file__).resolve().parents[2]
DATABASE = "notifyqueue"
SLOT = "standby1"
DEBIAN_15 = Path("/usr/lib/postgresql/15/bin")
PROGRAMS = ("initdb", "pg_ctl", "pg_basebackup")


def postgres_builds() -> dict[str, Path]:
    """The folders of PostgreSQL programs a failover test can use, by name: the pgserver
    wheel's (PostgreSQL 16, on CPython 3.11-3.12) and Debian's 15, where each is installed."""
    builds = {}
    # Found, not imported: importing pgserver warns (platformdirs) where XDG_RUNTIME_DIR is unset.
    spec = importlib.util.find_spec("pgserver")
    if spec is not None and spec.origin is not None:
        wheel = Path(spec.origin).parent / "pginstall" / "bin"
        if all((wheel / program).exists() for program in PROGRAMS):
            builds["pgserver"] = wheel
    if all((DEBIAN_15 / program).exists() for program in PROGRAMS):
        builds["debian-15"] = DEBIAN_15
    return builds


def _run_as() -> tuple[list[str], pwd.struct_passwd | None]:
    """PostgreSQL refuses to run as root: as root, its programs run as the account Debian's
    packages create (or the one pgserver creates)."""
    if os.geteuid() != 0:
        return [], None
    for name in ("postgres", "pgserver"):
        with contextlib.suppress(KeyError):
            return ["runuser", "-u", name, "--"], pwd.getpwnam(name)
    raise RuntimeError("running as root needs a 'postgres' or 'pgserver' account for PostgreSQL")


class ReplicationLink:
    """A TCP relay on 127.0.0.1 between the standby and the primary. `hold()` stops every byte
    in both directions where it is; `close()` drops what was held and every connection."""

    def __init__(self, target_port: int) -> None:
        self._target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._passing = threading.Event()
        self._passing.set()
        self._closed = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def hold(self) -> None:
        self._passing.clear()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sockets, self._sockets = self._sockets, []
        self._passing.set()  # the pumps wake, see the link closed, and drop what they hold
        for sock in [self._listener, *sockets]:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                standby, _ = self._listener.accept()
            except OSError:
                return
            try:
                primary = socket.create_connection(("127.0.0.1", self._target_port), timeout=5)
            except OSError:
                standby.close()
                continue
            primary.settimeout(None)
            with self._lock:
                if self._closed:
                    standby.close()
                    primary.close()
                    return
                self._sockets += [standby, primary]
            for source, sink in ((standby, primary), (primary, standby)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                self._passing.wait()
                if self._closed:
                    return
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)


@dataclass
class Server:
    name: str
    data: Path
    port: int

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{DATABASE}"


class _Programs:
    """PostgreSQL's programs from one folder, run (as root: as PostgreSQL's account) in a
    temporary folder of their own."""

    def __init__(self, bin_dir: Path, prefix: str) -> None:
        self.bin_dir = bin_dir
        self._run_as, self._owner = _run_as()
        self.folder = Path(tempfile.mkdtemp(prefix=prefix))
        if self._owner is not None:
            os.chown(self.folder, self._owner.pw_uid, self._owner.pw_gid)

    def _program(self, name: str, *args: str, check: bool = True) -> str:
        # Output to a file, never a pipe: a server pg_ctl starts inherits it and keeps it open.
        program = name if name == "cp" else str(self.bin_dir / name)
        with tempfile.TemporaryFile() as out:
            done = subprocess.run(
                [*self._run_as, program, *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                cwd=self.folder,
                timeout=120,
            )
            out.seek(0)
            text = out.read().decode(errors="replace")
        if check and done.returncode != 0:
            raise RuntimeError(f"{name} {' '.join(args)} failed ({done.returncode}):\n{text}")
        return text

    def _write(self, path: Path, text: str) -> None:
        with open(path, "a") as file:
            file.write(text)
        if self._owner is not None:
            os.chown(path, self._owner.pw_uid, self._owner.pw_gid)

    def start(self, server: Server) -> None:
        log = self.folder / f"{server.name}.log"
        self._program("pg_ctl", "-D", str(server.data), "-w", "-t", "60", "-l", str(log), "start")

    def stop(self, server: Server, mode: str) -> None:
        self._program("pg_ctl", "-D", str(server.data), "-m", mode, "stop")

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def manage(*args: str, url: str, **env: str) -> str:
    """`manage.py` against `url`; its standard output."""
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": url, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


class MigratedCluster(_Programs):
    """A stopped PostgreSQL data folder with the project's schema migrated and one API client
    (`api_key`), for failover tests to copy: a migration takes seconds, a copy a fraction."""

    def __init__(self, bin_dir: Path) -> None:
        super().__init__(bin_dir, "notifyqueue-migrated-")
        self.server = Server("template", self.folder / "data", free_port())
        self.version = self._program("pg_ctl", "--version").strip()
        self.api_key = ""

    def build(self) -> MigratedCluster:
        data = str(self.server.data)
        self._program("initdb", "-D", data, "-U", "postgres", "--auth=trust", "--no-sync")
        self._write(
            self.server.data / "postgresql.conf",
            "\n".join(
                [
                    "listen_addresses = '127.0.0.1'",
                    f"port = {self.server.port}",
                    f"unix_socket_directories = '{self.folder}'",
                    "wal_level = replica",
                    "max_wal_senders = 4",
                    "max_replication_slots = 4",
                    "hot_standby = on",
                    "max_connections = 60",
                    "shared_buffers = 32MB",
                    "jit = off",
                    "",
                ]
            ),
        )
        self.start(self.server)
        try:
            admin = f"postgresql://postgres@127.0.0.1:{self.server.port}/postgres"
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f"CREATE DATABASE {DATABASE}")
            manage("migrate", "--verbosity", "0", url=self.server.url)
            made = manage(
                *("create_client", "failover", "--webhook-url", "http://127.0.0.1:9/hooks"),
                url=self.server.url,
                NOTIFYQUEUE_WEBHOOK_ALLOW_PRIVATE="true",
            )
            self.api_key = json.loads(made)["api_key"]
        finally:
            self.stop(self.server, "fast")
        return self


class PrimaryAndStandby(_Programs):
    """A primary copied from a `MigratedCluster` and a standby `pg_basebackup` makes from it
    over a replication slot, both started; `synchronous` makes every commit wait until the
    standby has the commit's WAL on disk (`synchronous_standby_names`)."""

    def __init__(self, template: MigratedCluster, *, synchronous: bool) -> None:
        super().__init__(template.bin_dir, "notifyqueue-failover-")
        self.template = template
        self.synchronous = synchronous
        self.version = template.version
        self.primary = Server("primary", self.folder / "primary", free_port())
        self.standby = Server("standby", self.folder / "standby", free_port())
        self.link: ReplicationLink | None = None

    @property
    def url(self) -> str:
        """libpq's multi-host URL: whichever of the two accepts writes."""
        return (
            f"postgresql://postgres@127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
            f"/{DATABASE}?target_session_attrs=read-write&connect_timeout=2"
        )

    def build(self) -> None:
        self._program("cp", "-a", str(self.template.server.data), str(self.primary.data))
        self._write(
            self.primary.data / "postgresql.auto.conf",
            f"port = {self.primary.port}\nunix_socket_directories = '{self.folder}'\n",
        )
        self.start(self.primary)
        with psycopg.connect(self._admin_url(self.primary), autocommit=True) as conn:
            conn.execute("SELECT pg_create_physical_replication_slot(%s)", (SLOT,))
        self.link = ReplicationLink(self.primary.port)
        self._program(
            "pg_basebackup",
            *("-h", "127.0.0.1", "-p", str(self.primary.port), "-U", "postgres"),
            *("-D", str(self.standby.data), "-S", SLOT, "-X", "stream", "-c", "fast"),
            "--no-sync",
        )
        self._write(self.standby.data / "standby.signal", "")
        # The promoted standby has no standby of its own: it must not wait for one.
        self._write(
            self.standby.data / "postgresql.auto.conf",
            f"port = {self.standby.port}\n"
            f"primary_conninfo = 'host=127.0.0.1 port={self.link.port} user=postgres "
            f"application_name={SLOT}'\n"
            f"primary_slot_name = '{SLOT}'\n"
            "synchronous_standby_names = ''\n",
        )
        self.start(self.standby)
        if self.synchronous:
            # Only now: a primary waiting for a standby it does not have yet commits nothing.
            with psycopg.connect(self._admin_url(self.primary), autocommit=True) as conn:
                conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{SLOT}'")
                conn.execute("SELECT pg_reload_conf()")
        self.wait_streaming()

    def client_webhook_set(self, url: str) -> None:
        """Points the template's API client's webhooks at `url`."""
        with psycopg.connect(self.primary.url, autocommit=True) as conn:
            conn.execute("UPDATE clients_client SET webhook_url = %s", (url,))

    def _admin_url(self, server: Server) -> str:
        return f"postgresql://postgres@127.0.0.1:{server.port}/postgres"

    def wait_streaming(self, timeout_s: float = 30) -> None:
        """Until the primary streams to the standby (as its synchronous standby, if so)."""
        wanted = "sync" if self.synchronous else "async"
        deadline = time.monotonic() + timeout_s
        with psycopg.connect(self._admin_url(self.primary), autocommit=True) as conn:
            while time.monotonic() < deadline:
                row = conn.execute(
                    "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = %s",
                    (SLOT,),
                ).fetchone()
                if row == ("streaming", wanted):
                    return
                time.sleep(0.1)
        raise AssertionError(f"the standby is not streaming ({wanted}):\n{self.logs()}")

    def replicated_to(self) -> tuple[str, float]:
        """Waits until the standby has on disk all the WAL the primary had written when this
        was called; returns that position and the (monotonic) time it was read."""
        with psycopg.connect(self._admin_url(self.primary), autocommit=True) as conn:
            at = time.monotonic()
            (position,) = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        deadline = time.monotonic() + 30
        with psycopg.connect(self._admin_url(self.standby), autocommit=True) as conn:
            while time.monotonic() < deadline:
                (behind,) = conn.execute(
                    "SELECT pg_last_wal_receive_lsn() < %s::pg_lsn", (position,)
                ).fetchone()
                if not behind:
                    return position, at
                time.sleep(0.02)
        raise AssertionError(f"the standby did not receive {position}:\n{self.logs()}")

    def stop_primary(self) -> None:
        """`pg_ctl stop -m immediate`: every backend of the primary dies at once, without a
        checkpoint, as in a crash; the link to the standby is cut with it, dropping what it
        held."""
        self.stop(self.primary, "immediate")
        assert self.link is not None
        self.link.close()

    def promote(self) -> None:
        """`pg_ctl promote` on the standby, waiting until it accepts writes."""
        self._program("pg_ctl", "-D", str(self.standby.data), "-w", "-t", "60", "promote")

    def logs(self) -> str:
        texts = []
        for name in ("primary", "standby"):
            path = self.folder / f"{name}.log"
            if path.exists():
                texts.append(f"--- {name} ---\n{path.read_text(errors='replace')[-4000:]}")
        return "\n".join(texts)

    def close(self) -> None:
        if self.link is not None:
            self.link.close()
        for server in (self.primary, self.standby):
            if (server.data / "postmaster.pid").exists():
                self._program(
                    "pg_ctl", "-D", str(server.data), "-m", "immediate", "stop", check=False
                )
        super().close()


@contextlib.contextmanager
def primary_and_standby(
    template: MigratedCluster, *, synchronous: bool
) -> Iterator[PrimaryAndStandby]:
    pair = PrimaryAndStandby(template, synchronous=synchronous)
    try:
        pair.build()
        yield pair
    finally:
        pair.close()
