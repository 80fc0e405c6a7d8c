"""Notify Queue's benchmark, beside procrastinate and pgqueuer on one PostgreSQL.

Ingest, drain, quiet-hours release, slow provider, fairness, aging, webhooks, latency,
history, a backlogged recipient and the scale run (1-16 workers through PgBouncer), all in one
command:

    python3 dev.py bench [--quick] [--repeats 3] [--backlog 200000] [--large-backlog] ...

`dev.py bench` installs what this needs (bench/.venv with the peers, wrk from Debian) and runs
this file with bench/.venv's Python; see docs/performance.md for what each figure means. It
creates three databases on the PostgreSQL server the project uses (the embedded one under
.notifyqueue/ unless --database-url names another): notifyqueue_bench, bench_procrastinate
and bench_pgqueuer, dropped and created afresh on each run. It starts real processes: gunicorn
for the API, `manage.py run_worker` for drain, the peers' own workers, and an HTTP provider (and
webhook receiver) on 127.0.0.1, and for the scale run Debian's PgBouncer.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import hmac
import http.client
import json
import os
import random
import re
import resource
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
from psycopg.conninfo import conninfo_to_dict

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
PEERS = ("pgqueuer", "procrastinate")
DATABASES = {
    "ours": "notifyqueue_bench",
    "procrastinate": "bench_procrastinate",
    "pgqueuer": "bench_pgqueuer",
}
SQL_HEADER = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)
# The backlog cap stays on (its check runs on every create) but above any backlog used here.
BENCH_MAX_PENDING = 100_000_000
# Clients in the second webhook run (the first has one).
WEBHOOK_CLIENTS = 4
# The rate limit the workers run with here: the service's default (notifyqueue/settings.py).
BACKLOG_LIMIT, BACKLOG_WINDOW_S = 10, 3600.0
BENCH_SECRET_KEY = secrets.token_urlsafe(50)


# ---------------------------------------------------------------- configuration and output


@dataclass
class Config:
    repeats: int
    seconds: float
    backlog: int
    drain_rows: int
    quiet_users: int
    history_rows: int
    slow_rows: int
    # A peer's drain is timed for at most this long (procrastinate drains slowly here).
    peer_drain_seconds: float
    slow_concurrency: int
    latency_rate: float
    latency_seconds: float
    latency_warmup: float
    # fairness: one client floods `fairness_flood` rows, then each of the others creates
    # `fairness_quiet`, all at NORMAL priority, drained by `fairness_workers` processes.
    fairness_clients: int
    fairness_flood: int
    fairness_quiet: int
    fairness_workers: int
    # fairness on a slow provider: one worker (concurrency 8) and an HTTP provider answering
    # after `fairness_slow_delay` s; one client floods `fairness_slow_flood` rows, then
    # `fairness_slow_quiet` other clients create 5 rows each.
    fairness_slow_flood: int
    fairness_slow_quiet: int
    fairness_slow_delay: float
    # aging: one client's HIGH rows arrive at 100 % and 120 % of the drain rate for
    # `aging_seconds`, with a few LOW rows among them, aging period `aging_period` s, on and off.
    aging_seconds: float
    aging_period: float
    # webhooks: `webhook_rows` notifications (split among the run's clients) whose events one
    # worker's sender POSTs to a receiver answering at once.
    webhook_rows: int
    # scale: 1, 2, 4 ... run_worker processes through PgBouncer in transaction mode, each at
    # `scale_concurrency` against an HTTP provider answering after exactly `scale_latency_s`,
    # PgBouncer holding `scale_pool` server connections; each step drains `scale_seconds` of
    # the step's ideal rate (workers x concurrency / latency).
    scale_workers: list[int]
    scale_concurrency: int
    scale_latency_s: float
    scale_seconds: float
    scale_pool: int
    # backlog: one recipient over its limit with `backlog_held` rows held by the rate limit,
    # beside the drain of `drain_rows` other recipients' rows.
    backlog_held: int
    worker_concurrency: int
    worker_batch: int
    api_workers: int
    api_threads: int
    connections: int
    batch_connections: int
    sections: set[str]
    project_python: Path
    database_url: str | None
    port: int


SECTIONS = (
    "ingest",
    "batch",
    "receipts",
    "drain",
    "quiet",
    "digests",
    "slow",
    "fairness",
    "aging",
    "webhooks",
    "latency",
    "history",
    "backlog",
    "scale",
)
# The email provider's events secret for the receipts run (a fixed, throwaway key).
RECEIPTS_SECRET = "whsec_" + base64.b64encode(b"bench-receipts-key-0123456789abc").decode()


def config_parse(argv: list[str]) -> Config:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="one repeat, short runs, small backlog: about two minutes",
    )
    parser.add_argument("--repeats", type=int, help="repeats of every measurement (default 3)")
    parser.add_argument("--seconds", type=float, help="length of each ingest run (default 5)")
    parser.add_argument(
        "--backlog", type=int, help="PENDING rows for the backlog runs (default 200,000)"
    )
    parser.add_argument(
        "--large-backlog",
        action="store_true",
        help="a 1,000,000-row backlog (adds several minutes)",
    )
    parser.add_argument(
        "--drain-rows", type=int, help="rows per drain run (default 20,000; quick 10,000)"
    )
    parser.add_argument(
        "--quiet-users",
        type=int,
        help="users whose rows the quiet-hours run releases together (default 100,000; quick "
        "20,000)",
    )
    parser.add_argument(
        "--history-rows",
        type=int,
        help="finished rows for the history run (default the backlog size)",
    )
    parser.add_argument(
        "--fairness-flood",
        type=int,
        help="rows the flooding client creates in the fairness run (default 20,000; quick 5,000)",
    )
    parser.add_argument(
        "--fairness-quiet",
        type=int,
        default=50,
        help="rows each other client creates in the fairness run (default 50)",
    )
    parser.add_argument(
        "--fairness-clients",
        type=int,
        default=10,
        help="clients in the fairness run, the flooder included (default 10)",
    )
    parser.add_argument(
        "--fairness-workers",
        type=int,
        default=2,
        help="run_worker processes in the fairness run (default 2)",
    )
    parser.add_argument(
        "--fairness-slow-quiet",
        type=int,
        default=2,
        help="quiet clients (5 rows each) beside the flood on the slow provider (default 2)",
    )
    parser.add_argument(
        "--aging-seconds",
        type=float,
        help="length of each aging run's HIGH flood (default 12; quick 8)",
    )
    parser.add_argument(
        "--webhook-rows",
        type=int,
        help="notifications whose webhooks each webhook run sends (default 5,000; quick 2,000)",
    )
    parser.add_argument(
        "--scale-workers",
        default="1,2,4,8,16",
        help="run_worker processes at each step of the scale run (default 1,2,4,8,16)",
    )
    parser.add_argument(
        "--scale-concurrency",
        type=int,
        default=8,
        help="each scale worker's --concurrency (default 8)",
    )
    parser.add_argument(
        "--scale-latency",
        type=float,
        default=0.25,
        help="seconds the scale run's HTTP provider takes to answer, exactly (default 0.25)",
    )
    parser.add_argument(
        "--scale-seconds",
        type=float,
        help="seconds of the ideal rate each scale step drains (default 10; quick 5)",
    )
    parser.add_argument(
        "--scale-pool",
        type=int,
        default=8,
        help="PgBouncer's server connections in the scale run (default 8: four per core)",
    )
    parser.add_argument(
        "--backlog-held",
        type=int,
        default=100_000,
        help="rows the backlog run's recipient has held by its rate limit (default 100,000)",
    )
    parser.add_argument("--only", help=f"comma-separated sections: {','.join(SECTIONS)}")
    parser.add_argument("--api-workers", type=int, default=4)
    parser.add_argument("--api-threads", type=int, default=4)
    parser.add_argument(
        "--connections", type=int, default=8, help="connections for single creates (default 8)"
    )
    parser.add_argument("--worker-concurrency", type=int, default=16)
    parser.add_argument(
        "--worker-batch", type=int, default=250, help="run_worker --batch-size (its default: 250)"
    )
    parser.add_argument("--slow-concurrency", type=int, default=50)
    parser.add_argument(
        "--latency-rate", type=float, default=200, help="creates per second (default 200)"
    )
    parser.add_argument(
        "--latency-warmup",
        type=float,
        default=1.0,
        help="seconds at the latency rate before the measured ones, not counted (default 1; "
        "the peers' runs too)",
    )
    parser.add_argument("--project-python", type=Path, default=ROOT / ".venv" / "bin" / "python")
    parser.add_argument("--database-url", help="any database on the PostgreSQL server to use")
    parser.add_argument("--port", type=int, default=0, help="API port (default: a free one)")
    args = parser.parse_args(argv)
    quick = args.quick
    backlog = args.backlog or (1_000_000 if args.large_backlog else 20_000 if quick else 200_000)
    sections = set(args.only.split(",")) if args.only else set(SECTIONS)
    unknown = sections - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections: {', '.join(sorted(unknown))}")
    return Config(
        repeats=args.repeats or (1 if quick else 3),
        seconds=args.seconds or (3 if quick else 5),
        backlog=backlog,
        drain_rows=args.drain_rows or (10_000 if quick else 20_000),
        quiet_users=args.quiet_users or (20_000 if quick else 100_000),
        history_rows=args.history_rows or backlog,
        slow_rows=1_000 if quick else 2_000,
        peer_drain_seconds=5 if quick else 10,
        slow_concurrency=args.slow_concurrency,
        latency_rate=args.latency_rate,
        latency_seconds=5 if quick else 10,
        latency_warmup=args.latency_warmup,
        fairness_clients=max(2, args.fairness_clients),
        fairness_flood=args.fairness_flood or (5_000 if quick else 20_000),
        fairness_quiet=args.fairness_quiet,
        fairness_workers=args.fairness_workers,
        fairness_slow_flood=300,
        fairness_slow_quiet=max(1, args.fairness_slow_quiet),
        fairness_slow_delay=1.0,
        aging_seconds=args.aging_seconds or (8 if quick else 12),
        aging_period=2.0,
        webhook_rows=args.webhook_rows or (2_000 if quick else 5_000),
        scale_workers=[int(n) for n in args.scale_workers.split(",")],
        scale_concurrency=args.scale_concurrency,
        scale_latency_s=args.scale_latency,
        scale_seconds=args.scale_seconds or (5 if quick else 10),
        scale_pool=args.scale_pool,
        backlog_held=args.backlog_held,
        worker_concurrency=args.worker_concurrency,
        worker_batch=args.worker_batch,
        api_workers=args.api_workers,
        api_threads=args.api_threads,
        connections=args.connections,
        batch_connections=4,
        sections=sections,
        project_python=args.project_python,
        database_url=args.database_url,
        port=args.port or free_port(),
    )


@dataclass
class Figure:
    """One measured quantity over the repeats, ours and the peers', each run side by side."""

    name: str
    unit: str
    ours: list[float] = field(default_factory=list)
    peers: dict[str, list[float]] = field(default_factory=dict)
    note: str = ""
    # The key of another figure of ours to compare with, instead of the peers.
    versus: str | None = None


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:,.0f}"
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def ratio(ours: list[float], theirs: list[float]) -> str:
    """Median of the per-repeat ratios: each pair was measured in the same minute."""
    pairs = [a / b for a, b in zip(ours, theirs, strict=False) if b]
    if not pairs:
        return "-"
    if len(pairs) == 1:
        return f"{pairs[0]:.2f}x"
    return f"{statistics.median(pairs):.2f}x ({min(pairs):.2f}-{max(pairs):.2f})"


def table_print(figures: dict[str, Figure]) -> None:
    """A Markdown table (it pastes into docs/performance.md). A row compared with another of
    ours instead of the peers shows that figure, by its key, in the pgqueuer column."""
    header = ["what", "unit", "Notify Queue", "pgqueuer", "ratio", "procrastinate", "ratio"]
    rows = [header]
    for f in figures.values():
        row = [f.name, f.unit, spread(f.ours)]
        if f.versus and f.versus not in figures:  # --only left the compared row out
            row += [f"ours, [{f.versus}]: not measured in this run", "-", "", ""]
        elif f.versus:
            other = figures[f.versus]
            row += [f"ours, [{f.versus}]: {spread(other.ours)}", ratio(f.ours, other.ours)]
            row += ["", ""]
        else:
            for peer in PEERS:
                theirs = f.peers.get(peer, [])
                row += [spread(theirs), ratio(f.ours, theirs) if theirs else "-"]
        rows.append(row)
    rows = [
        [f"{cell} [{key}]" if n == 0 and key else cell for n, cell in enumerate(row)]
        for key, row in zip(["", *figures], rows, strict=True)
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    print()
    for n, r in enumerate(rows):
        print("| " + " | ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)) + " |")
        if n == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    notes = [f"- [{key}] {f.note}" for key, f in figures.items() if f.note]
    if notes:
        print("\n" + "\n".join(notes))


# ---------------------------------------------------------------- database and processes


# The other end of machine_speed()'s round trips: echoes each byte on the socket it is given.
_ECHO = (
    "import socket, sys\n"
    "s = socket.socket(fileno=int(sys.argv[1]))\n"
    "while b := s.recv(1):\n"
    "    s.send(b)"
)


def machine_speed() -> str:
    """The host's speed at the moment, in two figures: seconds for 20 million additions in a
    Python loop, and microseconds for a one-byte round trip between two processes over a Unix
    socket (a wake-up each way). The development VM shares its host: a day's additions ranged
    0.75 to 1.4 s, and on a day when creates ran at 40 % of the day before's, the additions were
    no slower while the round trip took 25 to 30 µs. A create is mostly wake-ups (the client,
    the API, PostgreSQL), so the second figure is the one to read a run's absolute figures
    against; ratios to the peers, measured in the same minute, need neither."""
    started = time.perf_counter()
    total = 0
    for i in range(20_000_000):
        total += i
    additions = time.perf_counter() - started
    ours, theirs = socket.socketpair()
    echo = subprocess.Popen(
        [sys.executable, "-c", _ECHO, str(theirs.fileno())], pass_fds=[theirs.fileno()]
    )
    theirs.close()
    with ours:
        for _ in range(2):  # the first round warms up
            started = time.perf_counter()
            for _ in range(20_000):
                ours.send(b"x")
                ours.recv(1)
            round_trip = (time.perf_counter() - started) / 20_000
    echo.wait(timeout=10)
    return (
        f"20 million additions {additions:.2f} s, "
        f"a round trip between processes {round_trip * 1e6:.0f} µs"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """The PostgreSQL server: URLs for its databases, for Django, psycopg and asyncpg."""

    def __init__(self, any_url: str) -> None:
        self.params = conninfo_to_dict(any_url)
        self.may_checkpoint = True

    def url(self, database: str) -> str:
        p = self.params
        user = quote(p.get("user", "postgres"))
        password = f":{quote(p['password'])}" if p.get("password") else ""
        host = p.get("host", "127.0.0.1")
        if host.startswith("/"):
            return f"postgresql://{user}{password}@/{database}?host={quote(host)}"
        port = f":{p['port']}" if p.get("port") else ""
        return f"postgresql://{user}{password}@{host}{port}/{database}"

    def connect(self, database: str, **kwargs) -> psycopg.Connection:
        return psycopg.connect(self.url(database), autocommit=True, **kwargs)

    def checkpoint(self) -> None:
        """A CHECKPOINT, before every timed run's setup, ours and the peers' alike: what the
        steps before wrote (the 1,000,000-row backlog and history are gigabytes of WAL) is on
        disk, and the run and its setup share one checkpoint cycle. Without it a checkpoint
        that an earlier step's WAL set off wrote its pages during whichever runs came next,
        and the first change to each page after it began went to the WAL whole, depressing
        that run's figures. A role that may not (neither superuser
        nor pg_checkpoint, on a server of --database-url) is told once, and runs go on
        without."""
        if not self.may_checkpoint:
            return
        try:
            with self.connect("postgres") as conn:
                conn.execute("CHECKPOINT")
        except psycopg.errors.InsufficientPrivilege:
            self.may_checkpoint = False
            log("this role may not CHECKPOINT: the timed runs start wherever the cycle stands")


def server_find(config: Config) -> Server:
    """The server of --database-url, else of DATABASE_URL (which `python3 dev.py bench` sets
    to the embedded PostgreSQL when it is not set already)."""
    url = config.database_url or os.environ.get("DATABASE_URL")
    if not url:
        raise SystemExit(
            "No PostgreSQL: run this through `python3 dev.py bench`, or pass "
            "--database-url (any database on the server to use)."
        )
    return Server(url)


def databases_create(server: Server) -> None:
    with server.connect("postgres") as conn:
        for name in DATABASES.values():
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')


def project_env(server: Server, **extra: str) -> dict[str, str]:
    env = {
        # As in production: a secret key of its own (settings refuse to run without one), plain
        # HTTP on loopback as behind a proxy that ends TLS.
        "DJANGO_SECRET_KEY": BENCH_SECRET_KEY,
        "DJANGO_SECURE_SSL_REDIRECT": "false",
        **os.environ,
        "DATABASE_URL": server.url(DATABASES["ours"]),
        "LOG_LEVEL": "WARNING",
        "NOTIFYQUEUE_CLIENT_MAX_PENDING": str(BENCH_MAX_PENDING),
        "NOTIFYQUEUE_SIMULATED_FAILURE_RATE": "0",
        "PYTHONUNBUFFERED": "1",
    }
    env.update(extra)
    return env


def manage(config: Config, server: Server, *args: str) -> str:
    done = subprocess.run(
        [str(config.project_python), str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env=project_env(server),
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"manage.py {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def peer_run(server: Server, command: str, system: str, *args: str, timeout: float = 600) -> dict:
    done = subprocess.run(
        [
            sys.executable,
            str(BENCH / "peers.py"),
            command,
            "--system",
            system,
            "--dsn",
            server.url(DATABASES[system]),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise SystemExit(f"peers.py {command} {system} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def cpu_seconds(pids: list[int]) -> dict[int, float]:
    """User + system CPU seconds each process used so far (Linux /proc); gone ones left out."""
    tick = os.sysconf("SC_CLK_TCK")
    used = {}
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            used[pid] = (int(fields[11]) + int(fields[12])) / tick
    return used


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
    return found


class CpuMeter:
    """CPU used by the API's gunicorn processes and by the PostgreSQL backends connected to
    our database, between `start` and `stop`: what a create costs, whatever else the machine
    runs (its other processes slow the figures, not these). Autovacuum's workers on our
    database are among those backends; what they spent is also given on its own, with how
    many times autovacuum vacuumed or analyzed a table in between, so that a figure raised by
    maintenance says so."""

    def __init__(self, server: Server, api: Api) -> None:
        self.server, self.api = server, api

    def _pids(self) -> tuple[list[int], dict[int, str], tuple[int, int]]:
        assert self.api.process is not None
        with self.server.connect(DATABASES["ours"]) as conn:
            backends = dict(
                conn.execute(
                    "SELECT pid, backend_type FROM pg_stat_activity WHERE datname = %s "
                    "AND pid <> pg_backend_pid()",
                    (DATABASES["ours"],),
                ).fetchall()
            )
            maintenance = conn.execute(
                "SELECT coalesce(sum(autovacuum_count), 0)::int, "
                "coalesce(sum(autoanalyze_count), 0)::int FROM pg_stat_user_tables"
            ).fetchone()
        return [self.api.process.pid, *children(self.api.process.pid)], backends, maintenance

    def start(self) -> None:
        api, database, self.maintenance = self._pids()
        self.before = (cpu_seconds(api), cpu_seconds(list(database)))

    def stop(self, count: int) -> str:
        """'API x ms, PostgreSQL y ms' of CPU per one of `count` items since `start`, and
        autovacuum's part of PostgreSQL's when it had one."""
        api, database, maintenance = self._pids()
        now = (cpu_seconds(api), cpu_seconds(list(database)))
        spent = [
            {pid: used - before.get(pid, 0.0) for pid, used in after.items()}
            for before, after in zip(self.before, now, strict=True)
        ]
        per = [1000 * sum(each.values()) / max(count, 1) for each in spent]
        note = f"API {per[0]:.2f} ms, PostgreSQL {per[1]:.2f} ms"
        vacuums, analyzes = (b - a for a, b in zip(self.maintenance, maintenance, strict=True))
        autovacuum = sum(
            used for pid, used in spent[1].items() if database[pid] == "autovacuum worker"
        )
        if autovacuum or vacuums or analyzes:
            note += (
                f" (autovacuum's workers {1000 * autovacuum / max(count, 1):.2f} ms of it; "
                f"{vacuums} vacuums and {analyzes} analyzes of a table meanwhile)"
            )
        return note


class Api:
    """gunicorn serving the project as production runs it, with several workers x threads."""

    def __init__(self, config: Config, server: Server, api_key: str, **env: str) -> None:
        self.config, self.server, self.api_key, self.env = config, server, api_key, env
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> Api:
        c = self.config
        self.process = subprocess.Popen(
            [
                str(c.project_python),
                "-m",
                "gunicorn",
                # As production runs it (README): the project's worker class, and every
                # process's metrics in one folder (prometheus_client's multi-process mode).
                "-c",
                "python:notifyqueue.gunicorn_conf",
                "-b",
                f"127.0.0.1:{c.port}",
                "-w",
                str(c.api_workers),
                "--threads",
                str(c.api_threads),
                "--log-level",
                "warning",
            ],
            cwd=ROOT,
            # The config makes a fresh metrics folder when none is given.
            env={
                k: v
                for k, v in project_env(self.server, **{"LOG_LEVEL": "ERROR", **self.env}).items()
                if k != "PROMETHEUS_MULTIPROC_DIR"
            },
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, http.client.HTTPException):
                conn = http.client.HTTPConnection("127.0.0.1", c.port, timeout=5)
                conn.request(
                    "GET",
                    "/api/v1/notifications?page_size=1",
                    headers={"Authorization": f"Api-Key {self.api_key}"},
                )
                if conn.getresponse().status == 200:
                    self.warm_up()
                    return self
            time.sleep(0.2)
        raise SystemExit("gunicorn did not answer within 60 s")

    def warm_up(self) -> None:
        """Two seconds of authenticated reads on every connection, so that every worker
        process has started, imported its views and opened its database connection before a
        figure (or its CPU per create) is measured."""
        if shutil.which("wrk") is None:
            return
        subprocess.run(
            [
                "wrk",
                "-t2",
                f"-c{max(self.config.connections, 2)}",
                "-d2s",
                "-H",
                f"Authorization: Api-Key {self.api_key}",
                f"http://127.0.0.1:{self.config.port}/api/v1/notifications?page_size=1",
            ],
            capture_output=True,
            check=True,
        )

    def __exit__(self, *exc) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=60)


def workers_start(
    config: Config,
    server: Server,
    count: int,
    *,
    until_empty: bool,
    concurrency: int | None = None,
    **env: str,
) -> list[subprocess.Popen]:
    command = [
        str(config.project_python),
        str(ROOT / "manage.py"),
        "run_worker",
        "--concurrency",
        str(concurrency or config.worker_concurrency),
        "--batch-size",
        str(config.worker_batch),
    ]
    if until_empty:
        command.append("--until-empty")
    return [
        started(
            subprocess.Popen(
                command, cwd=ROOT, env=project_env(server, **env), stderr=subprocess.DEVNULL
            )
        )
        for _ in range(count)
    ]


# Every worker process the benchmark started: those still running when it ends, however it
# ends, are stopped (`main`). One left behind would drain the next run's rows with its own
# provider: its rows would never reach that run's provider.
_STARTED: list[subprocess.Popen] = []


def started(process: subprocess.Popen) -> subprocess.Popen:
    _STARTED.append(process)
    return process


def workers_ready(server: Server, processes: list[subprocess.Popen], timeout: float = 60) -> None:
    """Waits until every `run_worker` process has written its heartbeat (its loop is running):
    a drain timed while a second process is still importing Django, a core's work for a second
    or two, measures that start-up with it."""
    pids = [p.pid for p in processes]
    deadline = time.monotonic() + timeout
    with server.connect(DATABASES["ours"]) as conn:
        while time.monotonic() < deadline:
            # Running now: a stopped worker of an earlier run may have had the same pid.
            (ready,) = conn.execute(
                "SELECT count(*) FROM worker_heartbeat WHERE pid = ANY(%s) AND stopped_at IS NULL",
                [pids],
            ).fetchone()
            if ready == len(pids):
                return
            if any(p.poll() is not None for p in processes):
                raise SystemExit("a run_worker process exited before it was ready")
            time.sleep(0.05)
    raise SystemExit(f"run_worker processes not ready within {timeout:.0f} s")


def connections_ready(server: Server, database: str, count: int, timeout: float = 60) -> None:
    """Waits until `database` has `count` client connections besides this one: a peer's worker
    processes have connected (their loops start then), so their start-up is left out of the
    drain as ours is."""
    deadline = time.monotonic() + timeout
    with server.connect(database) as conn:
        while time.monotonic() < deadline:
            (connected,) = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
            ).fetchone()
            if connected >= count:
                time.sleep(0.3)  # past connecting: listening or polling
                return
            time.sleep(0.05)
    raise SystemExit(f"{database}: workers not connected within {timeout:.0f} s")


def processes_stop(processes: list[subprocess.Popen], timeout: float = 60) -> None:
    for p in processes:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in processes:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


# ---------------------------------------------------------------- rows


def queries_load(path: Path) -> dict[str, str]:
    parts = SQL_HEADER.split(path.read_text())
    return {
        name: body.strip().rstrip(";") for name, body in zip(parts[1::2], parts[2::2], strict=True)
    }


class Rows:
    """Writes and reads the project's rows directly, through its own create statement."""

    def __init__(self, server: Server, client_id: str) -> None:
        self.server = server
        self.client_id = client_id
        # Older versions (before/after comparisons) lack this statement: see create().
        self.create_many = queries_load(ROOT / "notifications" / "sql" / "notifications.sql").get(
            "notifications_create_many"
        )
        # ... and the queue table: see waiting(). Made after the migrations ran.
        with server.connect(DATABASES["ours"]) as conn:
            self.queue_table = queue_table_exists(conn)
        self.poll = Poll(server, DATABASES["ours"])

    def create(
        self,
        prefix: str,
        count: int,
        *,
        chunk: int = 5_000,
        priority: int = 2,
        conn: psycopg.Connection | None = None,
    ) -> None:
        """`count` PENDING notifications due now, each to its own recipient (the rate limit
        is per recipient), with keys `<prefix>-<n>`, committed together: workers already
        running see all of them at once. `priority` 0 CRITICAL ... 3 LOW. With `conn`, in
        that connection's transaction (several clients' rows committed together)."""
        if self.create_many is None:
            self._insert(prefix, count, status="PENDING")
            return
        if conn is not None:
            self._create(conn, prefix, count, chunk=chunk, priority=priority)
            return
        with self.server.connect(DATABASES["ours"]) as conn, conn.transaction():
            self._create(conn, prefix, count, chunk=chunk, priority=priority)

    def _create(
        self, conn: psycopg.Connection, prefix: str, count: int, *, chunk: int, priority: int
    ) -> None:
        for start in range(0, count, chunk):
            items = [
                {
                    "idempotency_key": f"{prefix}-{n}",
                    "request_fingerprint": "",
                    "channel": "email",
                    "recipient": f"{prefix}-{n}@example.com",
                    "subject": "Hi",
                    "body": "Your code is 123456",
                    "priority": priority,
                    "metadata": {},
                    "fallback_channels": [],
                    "max_attempts": 6,
                }
                for n in range(start, min(count, start + chunk))
            ]
            conn.execute(
                self.create_many, {"client_id": self.client_id, "items": json.dumps(items)}
            )

    def finished_create(self, prefix: str, count: int) -> None:
        """`count` rows already SENT, as history: written directly, never delivered."""
        self._insert(prefix, count, status="SENT")

    def _insert(self, prefix: str, count: int, *, status: str) -> None:
        with self.server.connect(DATABASES["ours"]) as conn:
            notifications_insert(conn, self.client_id, prefix, count, status=status)
            vacuum_analyze(conn)

    def delete_except(self, keep_prefixes: tuple[str, ...]) -> None:
        """Removes rows not delivered by the benchmark (ingest runs), and what hangs off them."""
        with self.server.connect(DATABASES["ours"]) as conn:
            condition = " AND ".join("idempotency_key NOT LIKE %s" for _ in keep_prefixes)
            params = [f"{p}-%" for p in keep_prefixes]
            where = f"WHERE {condition}" if keep_prefixes else ""
            doomed = f"SELECT id FROM notification {where}"
            for table in referencing_tables(conn):
                conn.execute(f"DELETE FROM {table} WHERE notification_id IN ({doomed})", params)
            conn.execute(f"DELETE FROM notification {where}", params)
            vacuum_analyze(conn)

    def waiting(self, prefix: str) -> int:
        """Rows of the run not yet final. With the queue table: the client's waiting rows,
        counted on the queue's own indexes (the run's rows are then the client's only waiting
        ones: a drain that never reaches 0 stops the benchmark), so a poll costs the backlog,
        not a look-up of each waiting row in the record. Older versions: the record, by key."""
        if self.queue_table:
            # Two counts, each on its partial index: with both statuses in one condition no
            # index serves it, and the queue's heap keeps its high-water mark (VACUUM never
            # truncates it), so after the 1,000,000-row backlog each poll read 113 MB of empty
            # pages, 15 ms of a core every 50 ms taken from the drain measured.
            return self.poll.count(
                "SELECT (SELECT count(*) FROM notification_queue"
                "        WHERE client_id = %(client)s AND status = 'PENDING')"
                "     + (SELECT count(*) FROM notification_queue"
                "        WHERE client_id = %(client)s AND status = 'PROCESSING')",
                {"client": self.client_id},
            )
        return self.poll.count(
            "SELECT count(*) FROM notification WHERE idempotency_key LIKE %s "
            "AND status IN ('PENDING', 'PROCESSING')",
            [f"{prefix}-%"],
        )


class Poll:
    """One connection for the depth polls of a drain, every 50 ms: a connection per poll cost
    a server process started and ended each time, CPU taken from the system measured (a few
    per cent of a drain, for ours and the peers alike). Reconnects if the server dropped it."""

    def __init__(self, server: Server, database: str) -> None:
        self.server, self.database = server, database
        self.conn: psycopg.Connection | None = None

    def count(self, sql: str, params: Sequence[Any] = ()) -> int:
        try:
            return self._count(sql, params)
        except psycopg.OperationalError:
            self.close()  # dropped by the server: once more, on a new connection
            return self._count(sql, params)

    def _count(self, sql: str, params: Sequence[Any]) -> int:
        if self.conn is None:
            self.conn = self.server.connect(self.database)
        return self.conn.execute(sql, params).fetchone()[0]

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def notifications_insert(
    executor: Any, client_id: str, prefix: str, count: int, *, status: str
) -> None:
    """`count` rows of the client written directly in one statement, keys and recipients
    `<prefix>-<n>`: a backlog (PENDING) or a history (SENT). `executor` is anything with
    `execute(sql, params)`: a psycopg connection here, a Django cursor in
    bench/pg_instructions.py."""
    executor.execute(
        """
        INSERT INTO notification (id, client_id, idempotency_key, request_fingerprint,
            channel, recipient, subject, body, priority, metadata, fallback_channels,
            status, send_at, due_at, attempt_count, max_attempts, operator_retries,
            sent_at, created_at, updated_at)
        SELECT notifyqueue_uuid7(), %s, %s || '-' || g, '', 'email',
               %s || '-' || g || '@example.com', 'Hi', 'Body', 2, '{}', '[]', %s,
               now(), now(), 0, 6, 0, CASE WHEN %s = 'SENT' THEN now() END, now(), now()
          FROM generate_series(1, %s) AS g
        """,
        [client_id, prefix, prefix, status, status, count],
    )


def quiet_held_insert(conn: psycopg.Connection, client_id: str, prefix: str, count: int):
    """`count` users of the client whose quiet hours (UTC) end at the same whole minute, one to
    two minutes from now by the database's clock, each with one notification in preference
    mode held by them until then (as the quiet-hours stage leaves a row), all in one commit.
    Returns that minute."""
    with conn.transaction():
        (release_at,) = conn.execute(
            "SELECT date_trunc('minute', notifyqueue_now() + interval '1 minute') "
            "+ interval '1 minute'"
        ).fetchone()
        conn.execute(
            """
            INSERT INTO user_preferences (id, client_id, user_id, channels, addresses,
                muted_events, disabled_channels, timezone, quiet_hours, created_at, updated_at)
            SELECT gen_random_uuid(), %(client)s, %(prefix)s || '-u' || g, '["email"]',
                   jsonb_build_object('email', %(prefix)s || '-' || g || '@example.com'),
                   '[]', '[]', 'UTC',
                   jsonb_build_array(jsonb_build_object(
                       'start', to_char(%(at)s AT TIME ZONE 'UTC' - interval '8 hours', 'HH24:MI'),
                       'end', to_char(%(at)s AT TIME ZONE 'UTC', 'HH24:MI'))),
                   now(), now()
              FROM generate_series(1, %(count)s) AS g
            """,
            {"client": client_id, "prefix": prefix, "count": count, "at": release_at},
        )
        conn.execute(
            """
            INSERT INTO notification (id, client_id, idempotency_key, request_fingerprint,
                channel, recipient, subject, body, priority, metadata, fallback_channels,
                status, send_at, due_at, attempt_count, max_attempts, operator_retries,
                created_at, updated_at, user_id, template, payload, quiet_held_since)
            SELECT notifyqueue_uuid7(), %(client)s, %(prefix)s || '-' || g, '', 'email',
                   %(prefix)s || '-' || g || '@example.com', 'Hi', 'Body', 2, '{}', '[]',
                   'PENDING', now(), %(at)s, 0, 6, 0, now(), now(), %(prefix)s || '-u' || g,
                   'order_shipped', '{}', now()
              FROM generate_series(1, %(count)s) AS g
            """,
            {"client": client_id, "prefix": prefix, "count": count, "at": release_at},
        )
    return release_at


def queue_table_exists(conn: psycopg.Connection) -> bool:
    return conn.execute("SELECT to_regclass('notification_queue') IS NOT NULL").fetchone()[0]


def vacuum_analyze(conn: psycopg.Connection) -> None:
    conn.execute("VACUUM ANALYZE notification")
    if queue_table_exists(conn):
        conn.execute("VACUUM ANALYZE notification_queue")


def referencing_tables(conn: psycopg.Connection) -> list[str]:
    rows = conn.execute(
        """
        SELECT DISTINCT c.conrelid::regclass::text
          FROM pg_constraint c
         WHERE c.contype = 'f' AND c.confrelid = 'notification'::regclass
        """
    ).fetchall()
    return [r[0] for r in rows]


def peer_fill(server: Server, system: str, count: int) -> None:
    """`count` due no-op jobs, written directly (the peers' batch APIs are measured apart)."""
    with server.connect(DATABASES[system]) as conn:
        if system == "procrastinate":
            conn.execute(
                "INSERT INTO procrastinate_jobs (queue_name, task_name, args) "
                "SELECT 'default', 'noop', '{}' FROM generate_series(1, %s)",
                [count],
            )
        else:
            conn.execute(
                "INSERT INTO pgqueuer (priority, entrypoint, status) "
                "SELECT 0, 'noop', 'queued' FROM generate_series(1, %s)",
                [count],
            )
        conn.execute("ANALYZE")


def peer_table(system: str) -> str:
    """The table of a peer's jobs."""
    return "procrastinate_jobs" if system == "procrastinate" else "pgqueuer"


def peer_vacuum_analyze(server: Server, system: str) -> None:
    """A peer's backlog vacuumed as ours is (`vacuum_analyze`) before the timed creates: left
    to autovacuum, a million new rows are vacuumed within its naptime, during whichever
    timed runs come next, ours or the peers'."""
    with server.connect(DATABASES[system]) as conn:
        conn.execute(f"VACUUM (ANALYZE) {peer_table(system)}")


def peer_empty(server: Server, system: str) -> None:
    with server.connect(DATABASES[system]) as conn:
        conn.execute(f"TRUNCATE {peer_table(system)} CASCADE")


def peer_waiting(poll: Poll, system: str) -> int:
    if system == "procrastinate":
        sql = "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"
    else:
        sql = "SELECT count(*) FROM pgqueuer"
    return poll.count(sql)


def drain_timed(
    waiting: Callable[[], int],
    total: int,
    processes: list[subprocess.Popen],
    *,
    max_seconds: float | None = None,
    timeout: float = 900,
) -> float:
    """Rows per second from the first row gone until the queue is empty (or, with
    `max_seconds`, until that long after the first row went), polling the queue's depth the
    same way for every system, so process start-up is left out alike. The processes are
    stopped afterwards; without `max_seconds` the queue must have been emptied."""
    deadline = time.monotonic() + timeout
    first_at = first_left = None
    left, last_at = total, time.monotonic()
    while time.monotonic() < deadline:
        left, last_at = waiting(), time.monotonic()
        if first_at is None and left < total:
            first_at, first_left = last_at, left
        if left == 0 or all(p.poll() is not None for p in processes):
            break
        if first_at is not None and max_seconds and last_at - first_at >= max_seconds:
            break
        time.sleep(0.05)
    processes_stop(processes)
    if first_at is None or (left and not max_seconds):
        raise SystemExit(f"drain did not finish: {left} of {total} still waiting")
    return (first_left - left) / max(last_at - first_at, 1e-3)


# ---------------------------------------------------------------- load generators


def wrk_single(config: Config, api_key: str, prefix: str) -> tuple[float, int]:
    """Single creates from wrk at `connections`; returns (201s per second, other answers)."""
    threads = min(4, config.connections)
    done = subprocess.run(
        [
            "wrk",
            f"-t{threads}",
            f"-c{config.connections}",
            f"-d{config.seconds:g}s",
            "-s",
            str(BENCH / "create.lua"),
            f"http://127.0.0.1:{config.port}",
        ],
        env={**os.environ, "API_KEY": api_key, "KEY_PREFIX": prefix},
        capture_output=True,
        text=True,
        check=True,
    )
    found = re.search(r"RESULT requests=(\d+) non201=(\d+) duration_us=(\d+)", done.stdout)
    if not found:
        raise SystemExit(f"wrk printed no RESULT line:\n{done.stdout}\n{done.stderr}")
    requests, non201, duration_us = map(int, found.groups())
    return (requests - non201) / (duration_us / 1e6), non201


def batch_body(prefix: str, size: int) -> bytes:
    items = [
        {
            "idempotency_key": f"{prefix}-{n}",
            "channel": "email",
            "recipient": "bench@example.com",
            "subject": "Hi",
            "body": "Your code is 123456",
        }
        for n in range(size)
    ]
    return json.dumps({"notifications": items}).encode()


def http_batch(
    config: Config, api_key: str, prefix: str, size: int = 1000
) -> tuple[float, int, int]:
    """1,000-item batches from `batch_connections` keep-alive connections for `seconds`;
    returns (201s per second, other answers, 201s)."""
    deadline = time.monotonic() + config.seconds
    created, refused = Counter(), Counter()

    def loop(worker: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", config.port, timeout=120)
        n = 0
        while time.monotonic() < deadline:
            body = batch_body(f"{prefix}-{worker}-{n}", size)
            conn.request(
                "POST",
                "/api/v1/notifications/batch",
                body,
                {"Authorization": f"Api-Key {api_key}", "Content-Type": "application/json"},
            )
            answer = conn.getresponse()
            data = answer.read()
            if answer.status != 200:
                refused[worker] += size
            else:
                statuses = Counter(r["status"] for r in json.loads(data)["results"])
                created[worker] += statuses[201]
                refused[worker] += size - statuses[201]
            n += 1

    return run_loops(loop, config.batch_connections, created, refused)


def run_loops(
    loop: Callable[[int], None], count: int, good: Counter, bad: Counter
) -> tuple[float, int, int]:
    """Runs `loop(0)` ... `loop(count - 1)` on threads of their own until all return; returns
    (what they counted in `good` per second, the sum of `bad`, the sum of `good`)."""
    started = time.monotonic()
    threads = [threading.Thread(target=loop, args=(w,)) for w in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = sum(good.values())
    return total / (time.monotonic() - started), sum(bad.values()), total


# Recipients (and so buckets) the digests run's creates are spread over.
DIGEST_BUCKETS = 200


def api_put(config: Config, api_key: str, path: str, body: dict) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", config.port, timeout=60)
    conn.request(
        "PUT",
        path,
        json.dumps(body).encode(),
        {"Content-Type": "application/json", "Authorization": f"Api-Key {api_key}"},
    )
    answer = conn.getresponse()
    answer.read()
    if answer.status not in (200, 201):
        raise SystemExit(f"PUT {path}: {answer.status}")


def http_digests(
    config: Config, api_key: str, prefix: str, *, opening: bool = False
) -> tuple[float, int, int]:
    """Digest creates from `connections` keep-alive connections for `seconds`, round the
    DIGEST_BUCKETS recipients; returns (collected per second, other answers, collected). The
    first create of each recipient opens its bucket (queued, not counted); `opening`: one
    create per recipient, however long that takes."""
    deadline = time.monotonic() + (3600 if opening else config.seconds)
    collected, other = Counter(), Counter()
    numbers = iter(range(1, DIGEST_BUCKETS + 1 if opening else 10**9))
    lock = threading.Lock()

    def loop(worker: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", config.port, timeout=120)
        while time.monotonic() < deadline:
            with lock:
                n = next(numbers, None)
            if n is None:
                return
            body = {
                "channel": "email",
                "recipient": f"d{n % DIGEST_BUCKETS}@example.com",
                "template": "digest-bench",
                "payload": {"who": f"user {n}"},
                "digest_key": "thread",
                "digest_window_seconds": 3600,
            }
            conn.request(
                "POST",
                "/api/v1/notifications",
                json.dumps(body).encode(),
                {
                    "Content-Type": "application/json",
                    "Authorization": f"Api-Key {api_key}",
                    "Idempotency-Key": f"{prefix}-{n}",
                },
            )
            answer = conn.getresponse()
            data = answer.read()
            if answer.status == 201:
                if json.loads(data).get("held_reason") == "digest":
                    collected[worker] += 1
            else:
                other[worker] += 1

    return run_loops(loop, config.connections, collected, other)


def http_receipts(config: Config, prefix: str, rows: int) -> tuple[float, int, int]:
    """Signed `delivered` receipts, each for another of the `rows` sent messages
    `rcpt-<prefix>-<n>`, from `connections` keep-alive connections for `seconds` (or until
    every message has had one); returns (applied per second, other answers, applied). The
    signing is done here, as a provider's adapter would, on the same machine."""
    key = base64.b64decode(RECEIPTS_SECRET.removeprefix("whsec_"))
    deadline = time.monotonic() + config.seconds
    applied, other = Counter(), Counter()
    numbers = iter(range(1, rows + 1))
    lock = threading.Lock()

    def loop(worker: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", config.port, timeout=120)
        while time.monotonic() < deadline:
            with lock:
                n = next(numbers, None)
            if n is None:
                return
            body = json.dumps(
                {
                    "message_id": f"rcpt-{prefix}-{n}",
                    "type": "delivered",
                    "timestamp": "2026-12-01T12:00:00Z",
                }
            ).encode()
            event_id, stamp = f"evt-{prefix}-{n}", str(int(time.time()))
            digest = hmac.new(key, f"{event_id}.{stamp}.".encode() + body, hashlib.sha256)
            conn.request(
                "POST",
                "/api/v1/providers/email/events",
                body,
                {
                    "Content-Type": "application/json",
                    "webhook-id": event_id,
                    "webhook-timestamp": stamp,
                    "webhook-signature": "v1," + base64.b64encode(digest.digest()).decode(),
                },
            )
            answer = conn.getresponse()
            data = answer.read()
            if answer.status == 200 and json.loads(data).get("result") == "applied":
                applied[worker] += 1
            else:
                other[worker] += 1

    return run_loops(loop, config.connections, applied, other)


class Provider:
    """An HTTP provider on 127.0.0.1 (asyncio, keep-alive) that answers after `delay_s` (with
    `jitter`, a time drawn evenly from delay_s * (1 +/- jitter)) and records when it first saw
    each notification and how often it was called for it."""

    def __init__(self, delay_s: float, *, jitter: float = 0.0) -> None:
        self.delay_s = delay_s
        self.jitter = jitter
        self.random = random.Random(7)
        self.first_seen: dict[str, float] = {}
        self.calls: Counter[str] = Counter()
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.ready = threading.Event()

    def __enter__(self) -> Provider:
        self.thread.start()
        self.ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/send"

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", self.port, backlog=1024)
        )
        self.ready.set()
        self.loop.run_forever()
        server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                key = ""
                for line in head.decode("latin-1").split("\r\n")[1:]:
                    name, _, value = line.partition(":")
                    if name.lower() == "content-length":
                        length = int(value)
                    elif name.lower() in ("idempotency-key", "webhook-id"):
                        key = value.strip()
                body = await reader.readexactly(length) if length else b""
                received = time.time()
                with contextlib.suppress(ValueError, KeyError):
                    key = key or json.loads(body)["id"]
                self.first_seen.setdefault(key, received)
                self.calls[key] += 1
                if self.delay_s:
                    spread = self.random.uniform(-self.jitter, self.jitter)
                    await asyncio.sleep(self.delay_s * (1 + spread))
                answer = json.dumps({"message_id": f"m-{key}"}).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: " + str(len(answer)).encode() + b"\r\n\r\n" + answer
                )
                await writer.drain()
        writer.close()


PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


class PgBouncer:
    """Debian's PgBouncer on 127.0.0.1 in front of one database of the server, in transaction
    mode with `pool` server connections (as tests/integration/test_pgbouncer.py starts it, with
    production's reset: none in transaction mode). `url` is what a process connects to."""

    def __init__(self, server: Server, database: str, pool: int) -> None:
        self.server, self.database, self.pool = server, database, pool
        self.folder = Path(tempfile.mkdtemp(prefix="bench-pgbouncer-"))
        self.process: subprocess.Popen | None = None
        self.port = 0

    def __enter__(self) -> PgBouncer:
        if not Path(PGBOUNCER).exists():
            raise SystemExit(
                "the scale run needs pgbouncer: `apt-get install pgbouncer` (python3 dev.py "
                "test installs it when run as root)"
            )
        p = self.server.params
        host = p.get("host", "127.0.0.1")
        user = p.get("user", "postgres")
        target = f"host={host} dbname={self.database} user={user}"
        if p.get("port"):
            target += f" port={p['port']}"
        if p.get("password"):
            target += f" password='{p['password']}'"
        (self.folder / "userlist.txt").write_text(f'"{user}" ""\n')
        settings = {
            "listen_addr": "127.0.0.1",
            "unix_socket_dir": "",
            "pidfile": "",
            "auth_type": "trust",
            "auth_file": str(self.folder / "userlist.txt"),
            "pool_mode": "transaction",
            "default_pool_size": str(self.pool),
            "max_db_connections": str(self.pool),
            "reserve_pool_size": "0",
            "max_client_conn": "1000",
            "log_connections": "0",
            "log_disconnections": "0",
            "log_pooler_errors": "1",
        }
        if os.geteuid() == 0:
            # PgBouncer will not run as root: the account that may reach the server's socket.
            settings["user"] = Path(host).owner() if host.startswith("/") else "nobody"
        config, log_path = self.folder / "pgbouncer.ini", self.folder / "pgbouncer.log"
        for _ in range(3):  # another process may take the free port before PgBouncer binds it
            self.port = free_port()
            config.write_text(
                f"[databases]\n{self.database} = {target}\n\n[pgbouncer]\n"
                f"listen_port = {self.port}\n"
                + "".join(f"{key} = {value}\n" for key, value in settings.items())
            )
            os.chmod(self.folder, 0o755)
            with open(log_path, "w") as out:
                self.process = subprocess.Popen([PGBOUNCER, str(config)], stdout=out, stderr=out)
            deadline = time.monotonic() + 20
            while self.process.poll() is None and time.monotonic() < deadline:
                with contextlib.suppress(OSError):
                    socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                    return self
                time.sleep(0.1)
            self.process.kill()
            self.process.wait()
        raise SystemExit(f"pgbouncer did not start:\n{log_path.read_text()[-2000:]}")

    @property
    def url(self) -> str:
        user = quote(self.server.params.get("user", "postgres"))
        return f"postgresql://{user}@127.0.0.1:{self.port}/{self.database}"

    def complaints(self) -> list[str]:
        """PgBouncer's own warnings and errors so far (none when every client was served)."""
        text = (self.folder / "pgbouncer.log").read_text()
        return re.findall(r"^.* (?:WARNING|ERROR|FATAL) .*$", text, re.M)

    def __exit__(self, *exc) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=10)
        shutil.rmtree(self.folder, ignore_errors=True)


# The claim with counters, for the scale run only (its own database; the project's claim is
# put back afterwards): `bench_claim_calls` counts claims; `bench_claim_seen` each row the
# locking scan handed to FOR UPDATE SKIP LOCKED (a join filter below the lock, evaluated once
# per candidate row); `bench_claim_locked` each row it locked; `bench_claim_taken` each row
# the claim returned. Seen minus locked: rows skipped because another claim, still open, held
# them. Locked minus taken: rows another claim had taken and committed since this claim's
# snapshot, which the lock finds in their new version and the claim's UPDATE then drops (its
# WHERE re-checks status and due time). Both are rows the claims stepped over.
CLAIM_SQL = ROOT / "delivery" / "sql" / "functions" / "notification_claim_due_many.sql"
CLAIM_COUNTERS = (
    "bench_claim_calls",
    "bench_claim_seen",
    "bench_claim_locked",
    "bench_claim_taken",
)


def claim_counted_sql() -> str:
    sql = CLAIM_SQL.read_text()
    edits = [
        (
            "#variable_conflict use_column\nBEGIN\n",
            "#variable_conflict use_column\nBEGIN\n    PERFORM nextval('bench_claim_calls');\n",
        ),
        (
            "AND (dp.priority, dp.client_id, notifyqueue_now())\n",
            "AND (dp.priority, dp.client_id, notifyqueue_now())\n"
            "              AND nextval('bench_claim_seen') > 0\n",
        ),
        (
            "            FOR UPDATE OF n SKIP LOCKED\n        ) AS head\n",
            "            FOR UPDATE OF n SKIP LOCKED\n        ) AS head\n"
            "        WHERE nextval('bench_claim_locked') > 0\n",
        ),
        (
            "    FROM claimed AS c\n    ORDER BY c.place;\n",
            "    FROM claimed AS c\n    WHERE nextval('bench_claim_taken') > 0\n"
            "    ORDER BY c.place;\n",
        ),
    ]
    for old, new in edits:
        if sql.count(old) != 1:
            raise SystemExit(f"the claim's SQL changed: cannot count its rows at {old!r}")
        sql = sql.replace(old, new)
    return sql


def claim_counters_install(conn: psycopg.Connection) -> None:
    for name in CLAIM_COUNTERS:
        conn.execute(f"CREATE SEQUENCE IF NOT EXISTS {name}")
    conn.execute(claim_counted_sql())


def claim_counters_remove(conn: psycopg.Connection) -> None:
    conn.execute(CLAIM_SQL.read_text())
    for name in CLAIM_COUNTERS:
        conn.execute(f"DROP SEQUENCE IF EXISTS {name}")


def claim_counters_read(conn: psycopg.Connection) -> dict[str, int]:
    """Each counter's value (0 before its first use)."""
    return {
        name: conn.execute(
            f"SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {name}"
        ).fetchone()[0]
        for name in CLAIM_COUNTERS
    }


def http_provider_env(provider: Provider) -> dict[str, str]:
    return {
        "NOTIFYQUEUE_EMAIL_PROVIDER": "http",
        "NOTIFYQUEUE_EMAIL_PROVIDER_URL": provider.url,
        "NOTIFYQUEUE_WEBHOOK_ALLOW_PRIVATE": "true",
        "NOTIFYQUEUE_PROVIDER_TIMEOUT_SECONDS": "10",
    }


def steady_creates(config: Config, api_key: str, prefix: str) -> int:
    """Single creates at a steady `latency_rate` per second for `latency_warmup` then
    `latency_seconds`, from a pool of keep-alive connections (open loop: a slow answer does
    not delay the next create). Keys are `prefix-n`, n counting from 0 in sending order."""
    total = int(config.latency_rate * (config.latency_warmup + config.latency_seconds))
    interval = 1.0 / config.latency_rate
    lock = threading.Lock()
    local = threading.local()
    next_n = iter(range(total))
    start = time.monotonic() + 0.2

    def loop() -> None:
        local.conn = http.client.HTTPConnection("127.0.0.1", config.port, timeout=60)
        while True:
            with lock:
                n = next(next_n, None)
            if n is None:
                return
            delay = start + n * interval - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            body = json.dumps(
                {
                    "channel": "email",
                    "recipient": f"{prefix}-{n}@example.com",
                    "body": "Your code is 123456",
                }
            )
            local.conn.request(
                "POST",
                "/api/v1/notifications",
                body,
                {
                    "Authorization": f"Api-Key {api_key}",
                    "Content-Type": "application/json",
                    "Idempotency-Key": f"{prefix}-{n}",
                },
            )
            local.conn.getresponse().read()

    threads = [threading.Thread(target=loop) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return total


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


# ---------------------------------------------------------------- the sections


class Bench:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.figures: dict[str, Figure] = {}
        self.server = server_find(config)
        self.checks: list[str] = []
        self.problems: list[str] = []
        # CPU per created notification, by figure key, one per repeat (CpuMeter).
        self.cpu: dict[str, list[str]] = {}
        self.api: Api | None = None
        # The fairness run's clients, made on first use: the flooder, then the quiet ones.
        self.fair_rows: list[Rows] = []
        self.hook_rows: list[Rows] = []
        self.aging_clients: list[Rows] = []
        # machine_speed() at the start and at the end.
        self.speeds: list[str] = []
        # The scale run's steps: (workers, rows/s, ideal, claims, rows a claim, share
        # stepped over, rows skipped locked, rows already taken, PostgreSQL's and the workers'
        # CPU ms a row, load average).
        self.scale_rows: list[tuple] = []

    def cpu_note(self, key: str, note: str, *, per: str = "create") -> None:
        self.cpu.setdefault(f"[{key}] per {per}", []).append(note)
        log(f"  CPU per {per}: {note}")

    def figure(self, key: str, name: str, unit: str, **kwargs) -> Figure:
        if key not in self.figures:
            self.figures[key] = Figure(name=name, unit=unit, **kwargs)
        return self.figures[key]

    def setup(self) -> None:
        c = self.config
        log(f"PostgreSQL: {self.server.url('postgres')}; databases {', '.join(DATABASES.values())}")
        databases_create(self.server)
        manage(c, self.server, "migrate", "--no-input", "--verbosity", "0")
        made = json.loads(manage(c, self.server, "create_client", "bench"))
        self.api_key = made["api_key"]
        with self.server.connect(DATABASES["ours"]) as conn:
            (self.client_id,) = conn.execute(
                "SELECT id FROM clients_client WHERE name = 'bench'"
            ).fetchone()
        self.rows = Rows(self.server, str(self.client_id))
        for system in PEERS:
            peer_run(self.server, "install", system)
        with self.server.connect("postgres") as conn:
            settings = conn.execute(
                "SELECT name, current_setting(name) FROM pg_settings WHERE name IN "
                "('server_version', 'fsync', 'synchronous_commit', 'shared_buffers', "
                "'max_connections', 'max_wal_size', 'checkpoint_timeout')"
            ).fetchall()
        log("PostgreSQL settings: " + ", ".join(f"{k}={v}" for k, v in settings))
        self.speeds.append(machine_speed())
        log(
            f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} "
            f"(other processes share them); {self.speeds[0]}"
        )

    def run(self) -> None:
        c = self.config
        self.setup()
        started = time.monotonic()
        if c.sections & {"ingest", "batch"}:
            with Api(c, self.server, self.api_key, NOTIFYQUEUE_API_RATE_LIMIT="0") as self.api:
                for r in range(c.repeats):
                    if "ingest" in c.sections:
                        self.ingest_single(r)
                    if "batch" in c.sections:
                        self.ingest_batch(r)
                if "ingest" in c.sections:
                    self.ingest_backlog()
            if "ingest" in c.sections:
                with Api(c, self.server, self.api_key) as self.api:
                    for r in range(c.repeats):
                        self.ingest_single(r, throttle=True)
            self.rows.delete_except(())
        if "digests" in c.sections:
            with Api(c, self.server, self.api_key, NOTIFYQUEUE_API_RATE_LIMIT="0") as self.api:
                for r in range(c.repeats):
                    self.digests(r)
        if "receipts" in c.sections:
            with Api(
                c,
                self.server,
                self.api_key,
                NOTIFYQUEUE_API_RATE_LIMIT="0",
                NOTIFYQUEUE_EMAIL_PROVIDER_EVENTS_SECRET=RECEIPTS_SECRET,
            ) as self.api:
                for r in range(c.repeats):
                    self.receipts(r)
        for r in range(c.repeats):
            if "drain" in c.sections or "history" in c.sections:
                for workers in (1, 2):
                    self.drain(r, workers)
            if "quiet" in c.sections:
                self.quiet_release(r)
            if "slow" in c.sections:
                self.slow_provider(r)
            if "fairness" in c.sections:
                self.fairness(r)
                for jitter in (0.2, 0.0):
                    self.fairness_slow(r, jitter=jitter)
                self.fairness_high(r)
            if "webhooks" in c.sections:
                self.webhook_loop(r)
                for clients in (1, WEBHOOK_CLIENTS):
                    self.webhooks(r, clients)
        if "latency" in c.sections:
            with Api(c, self.server, self.api_key, NOTIFYQUEUE_API_RATE_LIMIT="0") as self.api:
                for r in range(c.repeats):
                    self.latency(r)
        if "aging" in c.sections:
            self.aging()
        if "history" in c.sections:
            self.history()
        if "backlog" in c.sections:
            self.backlog()
        if "scale" in c.sections:
            for r in range(c.repeats):
                self.scale(r)
        self.exactly_once_check()
        log(f"measured in {time.monotonic() - started:,.0f} s")
        self.speeds.append(machine_speed())
        self.report()

    def ingest_single(self, r: int, *, throttle: bool = False) -> None:
        c = self.config
        key = "single-throttle" if throttle else "single"
        name = f"single create, {c.connections} connections, empty queue" + (
            ", API throttle on (default)" if throttle else ""
        )
        f = self.figure(key, name, "creates/s")
        self.rows.delete_except(())
        self.server.checkpoint()
        meter = CpuMeter(self.server, self.api)
        meter.start()
        rate, other = wrk_single(
            c, self.api_key, f"s{r}{'t' if throttle else ''}-{uuid.uuid4().hex[:6]}"
        )
        self.cpu_note(key, meter.stop(round(rate * c.seconds)))
        f.ours.append(rate)
        if other:
            f.note = f"{other} answers were not 201 (throttle 429s or errors)"
        log(f"{name}: {rate:,.0f}/s")
        if throttle:
            f.versus = "single"
            return
        for system in PEERS:
            peer_empty(self.server, system)
            self.server.checkpoint()
            got = peer_run(
                self.server,
                "ingest-single",
                system,
                "--seconds",
                str(c.seconds),
                "--connections",
                str(c.connections),
            )
            f.peers.setdefault(system, []).append(got["rate"])
            log(f"  {system}: {got['rate']:,.0f}/s")

    def receipts(self, r: int) -> None:
        """Signed delivery receipts posted from `connections` keep-alive connections, each
        for another sent message, so each is verified, recorded and applied (the
        notification's receipt, its webhook event). Beside the single create's rate."""
        c = self.config
        f = self.figure(
            "receipts",
            f"delivery receipt, signed, {c.connections} connections, each applied",
            "receipts/s",
            versus="single",
        )
        prefix = f"R{r}-{uuid.uuid4().hex[:6]}"
        rows = 20_000 if c.repeats > 1 else 10_000
        with self.server.connect(DATABASES["ours"]) as conn:
            notifications_insert(conn, str(self.client_id), prefix, rows, status="SENT")
            conn.execute(
                "INSERT INTO delivery_attempt (notification_id, claim_token, number, channel, "
                "worker, started_at, finished_at, outcome, provider_message_id) "
                "SELECT id, gen_random_uuid(), 1, 'email', 'bench', now(), now(), 'SENT', "
                "'rcpt-' || idempotency_key FROM notification WHERE idempotency_key LIKE %s",
                [f"{prefix}-%"],
            )
            vacuum_analyze(conn)
        self.server.checkpoint()
        meter = CpuMeter(self.server, self.api)
        meter.start()
        rate, other, total = http_receipts(c, prefix, rows)
        self.cpu_note("receipts", meter.stop(total), per="receipt")
        f.ours.append(rate)
        if other:
            f.note = f"{other} answers were not an applied receipt"
        log(f"{f.name}: {rate:,.0f}/s")
        with self.server.connect(DATABASES["ours"]) as conn:
            conn.execute("DELETE FROM delivery_receipt")
            conn.execute("DELETE FROM provider_event_seen")
            conn.execute("DELETE FROM webhook_event WHERE type <> 'status'")
            conn.execute(
                "DELETE FROM delivery_attempt WHERE notification_id IN "
                "(SELECT id FROM notification WHERE idempotency_key LIKE %s)",
                [f"{prefix}-%"],
            )
        self.rows.delete_except(())

    def digests(self, r: int) -> None:
        """Digest creates over HTTP from `connections` keep-alive connections, each create for
        one of DIGEST_BUCKETS recipients with the same digest key and an hour's window: the
        first of each recipient opens its bucket and is queued, the rest are collected (the
        events-collected rate, beside the plain single create). Then every bucket's window is
        made to end at once and 1 worker closes them all, each into one digest it then sends
        (the digests-closed rate, beside the plain drain of 1 worker)."""
        c = self.config
        collect = self.figure(
            "digest-collect",
            f"digest create, {c.connections} connections, {DIGEST_BUCKETS:,} open buckets",
            "events collected/s",
            versus="single",
            note="a create with a digest_key and digest_window_seconds whose bucket is open: "
            "it waits in the bucket instead of the queue; the ratio column compares with the "
            "plain single create",
        )
        close = self.figure(
            "digest-close",
            f"close of {DIGEST_BUCKETS:,} buckets together, 1 worker process (concurrency "
            f"{c.worker_concurrency}), simulated provider",
            "digests closed/s",
            versus="drain-1",
            note="each bucket's events marked DIGESTED and one digest rendered and created; "
            "counted until every bucket is closed; the ratio column compares digests closed "
            "with notifications drained by the plain drain of 1 worker",
        )
        prefix = f"D{r}-{uuid.uuid4().hex[:6]}"
        api_put(
            c,
            self.api_key,
            "/api/v1/templates/digest-bench/email",
            {"subject": "{who} commented", "body": "{digest_count} new:\n{digest_items}"},
        )
        self.rows.delete_except(())
        with self.server.connect(DATABASES["ours"]) as conn:
            conn.execute("DELETE FROM notification_digest")
        # Every bucket opened first (untimed): the timed creates are all collected.
        http_digests(c, self.api_key, f"{prefix}-open", opening=True)
        self.server.checkpoint()
        rate, other, total = http_digests(c, self.api_key, prefix)
        collect.ours.append(rate)
        if other:
            collect.note += f"; {other} answers were not 201"
        log(f"{collect.name}: {rate:,.0f}/s ({total:,} events)")
        with self.server.connect(DATABASES["ours"]) as conn:
            (buckets, collected) = conn.execute(
                "SELECT count(*), sum(collected) FROM notification_digest WHERE state = 'OPEN'"
            ).fetchone()
            conn.execute(
                "UPDATE notification_digest SET closes_at = notifyqueue_now() WHERE state = 'OPEN'"
            )
            vacuum_analyze(conn)
            conn.execute("VACUUM ANALYZE notification_digest")
        processes = workers_start(c, self.server, 1, until_empty=False)
        started = None
        deadline = time.monotonic() + 900
        with self.server.connect(DATABASES["ours"]) as conn:
            while time.monotonic() < deadline:
                (left,) = conn.execute(
                    "SELECT count(*) FROM notification_digest WHERE state <> 'CLOSED'"
                ).fetchone()
                if started is None and left < buckets:
                    started = time.monotonic()
                if not left:
                    break
                time.sleep(0.05)
            took = time.monotonic() - (started or time.monotonic())
            (carried,) = conn.execute(
                "SELECT count(*) FROM notification WHERE status = 'DIGESTED'"
            ).fetchone()
        processes_stop(processes)
        closed_rate = buckets / took if took else 0.0
        close.ours.append(closed_rate)
        log(
            f"{close.name}: {closed_rate:,.0f}/s ({buckets:,} digests carrying {carried:,} "
            f"events, {carried / took if took else 0:,.0f} events/s)"
        )
        if carried != collected:
            self.problems.append(f"digests run {r}: {collected} collected, {carried} DIGESTED")
        self.rows.delete_except(())

    def ingest_backlog(self) -> None:
        c = self.config
        log(f"backlog: {c.backlog:,} PENDING rows for the client (and as many jobs per peer)")
        self.rows.delete_except(())
        self.rows.create("backlog", c.backlog)
        with self.server.connect(DATABASES["ours"]) as conn:
            vacuum_analyze(conn)
        for system in PEERS:
            peer_empty(self.server, system)
            peer_fill(self.server, system, c.backlog)
            peer_vacuum_analyze(self.server, system)
        f = self.figure(
            "single-backlog",
            f"single create, {c.connections} connections, {c.backlog:,}-row backlog",
            "creates/s",
        )
        for r in range(c.repeats):
            self.server.checkpoint()
            meter = CpuMeter(self.server, self.api)
            meter.start()
            rate, _ = wrk_single(c, self.api_key, f"b{r}-{uuid.uuid4().hex[:6]}")
            self.cpu_note("single-backlog", meter.stop(round(rate * c.seconds)))
            f.ours.append(rate)
            log(f"{f.name}: {rate:,.0f}/s")
            for system in PEERS:
                self.server.checkpoint()
                got = peer_run(
                    self.server,
                    "ingest-single",
                    system,
                    "--seconds",
                    str(c.seconds),
                    "--connections",
                    str(c.connections),
                )
                f.peers.setdefault(system, []).append(got["rate"])
                log(f"  {system}: {got['rate']:,.0f}/s")
        for system in PEERS:
            peer_empty(self.server, system)

    def ingest_batch(self, r: int) -> None:
        c = self.config
        f = self.figure(
            "batch",
            f"batch create, 1,000 per request, {c.batch_connections} connections",
            "creates/s",
        )
        self.rows.delete_except(())
        self.server.checkpoint()
        meter = CpuMeter(self.server, self.api)
        meter.start()
        rate, refused, total = http_batch(c, self.api_key, f"B{r}-{uuid.uuid4().hex[:6]}")
        self.cpu_note("batch", meter.stop(total))
        f.ours.append(rate)
        if refused:
            f.note = f"{refused} items were not 201"
        log(f"{f.name}: {rate:,.0f}/s")
        for system in PEERS:
            peer_empty(self.server, system)
            self.server.checkpoint()
            got = peer_run(
                self.server,
                "ingest-batch",
                system,
                "--seconds",
                str(c.seconds),
                "--connections",
                str(c.batch_connections),
                "--batch",
                "1000",
            )
            f.peers.setdefault(system, []).append(got["rate"])
            log(f"  {system}: {got['rate']:,.0f}/s")

    def drain_ours(self, prefix: str, workers: int) -> float:
        """`workers` run_worker processes drain `drain_rows` rows: the processes are running,
        idle, before the rows are written (in one commit), so the rate is the drain's alone
        (the peers' runs below do the same)."""
        c = self.config
        processes = workers_start(c, self.server, workers, until_empty=False)
        workers_ready(self.server, processes)
        self.server.checkpoint()
        self.rows.create(prefix, c.drain_rows)
        return drain_timed(lambda: self.rows.waiting(prefix), c.drain_rows, processes)

    def drain(self, r: int, workers: int) -> None:
        c = self.config
        f = self.figure(
            f"drain-{workers}",
            f"drain, {workers} worker process"
            f"{'es' if workers > 1 else ''} (concurrency {c.worker_concurrency}), "
            "simulated provider",
            "notifications/s",
        )
        rate = self.drain_ours(f"drain{workers}r{r}", workers)
        f.ours.append(rate)
        log(f"{f.name}: {rate:,.0f}/s")
        for system in PEERS:
            peer_empty(self.server, system)
            processes = [
                started(
                    subprocess.Popen(
                        [
                            sys.executable,
                            str(BENCH / "peers.py"),
                            "worker",
                            "--system",
                            system,
                            "--dsn",
                            self.server.url(DATABASES[system]),
                            "--concurrency",
                            str(c.worker_concurrency),
                            "--batch-size",
                            str(c.worker_batch),
                            "--wait",  # running before its jobs are written; stopped when timed
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
                for _ in range(workers)
            ]
            connections_ready(self.server, DATABASES[system], workers)
            self.server.checkpoint()
            peer_fill(self.server, system, c.drain_rows)
            poll = Poll(self.server, DATABASES[system])
            got = drain_timed(
                lambda s=system, p=poll: peer_waiting(p, s),
                c.drain_rows,
                processes,
                max_seconds=c.peer_drain_seconds,
            )
            poll.close()
            f.peers.setdefault(system, []).append(got)
            log(f"  {system}: {got:,.0f}/s")

    def quiet_release(self, r: int) -> None:
        """The morning after quiet hours: `quiet_users` users, each with one notification
        (preference mode) held by the user's quiet hours until the same moment, the window's
        end, are released together and drained by 1 worker, whose send-time stages re-check
        each row's preferences and quiet hours. The rows are written as the quiet-hours stage
        leaves them (PENDING, held, due at the window's end) while the worker runs idle; the
        rate counts from the first row gone, as the plain drain's does."""
        c = self.config
        f = self.figure(
            "quiet-release",
            f"drain of {c.quiet_users:,} users' rows released together at the end of their quiet "
            f"hours, 1 worker process (concurrency {c.worker_concurrency}), simulated provider",
            "notifications/s",
            note="each row is a user's (preference mode): the drain reads the user's "
            "preferences and quiet hours at send time; the ratio column compares with the "
            "plain drain of 1 worker",
        )
        f.versus = "drain-1"
        prefix = f"quiet{r}"
        processes = workers_start(c, self.server, 1, until_empty=False)
        workers_ready(self.server, processes)
        with self.server.connect(DATABASES["ours"]) as conn:
            release_at = quiet_held_insert(conn, self.client_id, prefix, c.quiet_users)
            vacuum_analyze(conn)
            conn.execute("VACUUM ANALYZE user_preferences")
            (wait_s,) = conn.execute(
                "SELECT extract(epoch FROM %s - notifyqueue_now())", [release_at]
            ).fetchone()
        log(f"  {c.quiet_users:,} rows held until {release_at:%H:%M:%S} UTC ({wait_s:.0f} s)")
        self.server.checkpoint()
        rate = drain_timed(lambda: self.rows.waiting(prefix), c.quiet_users, processes)
        f.ours.append(rate)
        log(f"{f.name}: {rate:,.0f}/s")
        with self.server.connect(DATABASES["ours"]) as conn:
            (early,) = conn.execute(
                "SELECT count(*) FROM notification WHERE idempotency_key LIKE %s AND sent_at < %s",
                [f"{prefix}-%", release_at],
            ).fetchone()
        if early:
            self.problems.append(f"{early} rows held by quiet hours were sent before their end")

    def slow_provider(self, r: int) -> None:
        c = self.config
        bound = min(0.8 * c.slow_concurrency / 0.05, 2000)
        f = self.figure(
            "slow",
            f"drain, 1 worker, concurrency {c.slow_concurrency}, http "
            "provider answering after 50 ms",
            "notifications/s",
            note=f"target ≥ 0.8 x concurrency / 50 ms = {bound:,.0f}/s; the ratio "
            "column compares with the empty-queue drain of 1 worker",
        )
        f.versus = "drain-1"
        prefix = f"slow{r}"
        with Provider(0.05) as provider:
            self.server.checkpoint()
            self.rows.create(prefix, c.slow_rows)
            processes = workers_start(
                c,
                self.server,
                1,
                until_empty=True,
                concurrency=c.slow_concurrency,
                **http_provider_env(provider),
            )
            rate = drain_timed(lambda: self.rows.waiting(prefix), c.slow_rows, processes)
            self.provider_check(prefix, provider)
        f.ours.append(rate)
        log(f"{f.name}: {rate:,.0f}/s (target {bound:,.0f}/s)")

    def fairness_clients(self) -> list[Rows]:
        """The fairness run's clients (made with create_client): the flooder first."""
        c = self.config
        if not self.fair_rows:
            names = ["fair-flood"] + [f"fair-quiet-{n}" for n in range(1, c.fairness_clients)]
            self.fair_rows = self.clients_create(names)
        return self.fair_rows

    def clients_create(self, names: list[str]) -> list[Rows]:
        """Clients made with create_client, in the order of `names`."""
        for name in names:
            manage(self.config, self.server, "create_client", name)
        with self.server.connect(DATABASES["ours"]) as conn:
            ids = dict(
                conn.execute(
                    "SELECT name, id::text FROM clients_client WHERE name = ANY(%s)", [names]
                ).fetchall()
            )
        return [Rows(self.server, ids[name]) for name in names]

    def fairness(self, r: int) -> None:
        """One client floods a backlog at NORMAL, then every other client creates a few rows at
        NORMAL, while workers drain (running before the first create). Every time is the
        database clock's: created_at and sent_at of each row."""
        c = self.config
        flooder, *quiet = self.fairness_clients()
        prefix = f"fair{r}"
        processes = workers_start(c, self.server, c.fairness_workers, until_empty=False)
        time.sleep(3)  # the workers are listening before the first create
        log(
            f"fairness: client 1 creates {c.fairness_flood:,} rows, then {len(quiet)} clients "
            f"{c.fairness_quiet} each, all NORMAL; {c.fairness_workers} workers"
        )
        self.server.checkpoint()
        flooder.create(f"{prefix}-flood", c.fairness_flood)
        for n, rows in enumerate(quiet, 1):
            rows.create(f"{prefix}-quiet{n}", c.fairness_quiet)
        total = c.fairness_flood + len(quiet) * c.fairness_quiet
        deadline = time.monotonic() + 900
        while (
            sum(rows.waiting(prefix) for rows in (flooder, *quiet)) and time.monotonic() < deadline
        ):
            time.sleep(0.5)
        processes_stop(processes)
        with self.server.connect(DATABASES["ours"]) as conn:
            rows = conn.execute(
                "SELECT idempotency_key LIKE %s, extract(epoch FROM created_at)::float8, "
                "extract(epoch FROM sent_at)::float8 FROM notification "
                "WHERE idempotency_key LIKE %s ORDER BY created_at, idempotency_key",
                [f"{prefix}-flood-%", f"{prefix}-%"],
            ).fetchall()
        unsent = sum(1 for _, _, sent in rows if sent is None)
        if unsent or len(rows) != total:
            self.problems.append(
                f"fairness run {r}: {unsent} of {len(rows)} rows not sent ({total} created)"
            )
            return
        start = rows[0][1]  # the flood's first create
        first_sent = min(sent for _, _, sent in rows)
        last_sent = max(sent for _, _, sent in rows)
        rate = len(rows) / max(last_sent - first_sent, 1e-3)
        flood_waits = [1000 * (sent - made) for flood, made, sent in rows if flood]
        quiet_waits = [1000 * (sent - made) for flood, made, sent in rows if not flood]
        quiet_done = max(sent for flood, _, sent in rows if not flood)
        share = 100 * (quiet_done - start) / (last_sent - start)
        # Strict oldest-first order, at the rate just measured: the rows leave in creation
        # order, the k-th at first_sent + k / rate, so the quiet rows wait behind the flood.
        fifo_waits = [
            1000 * (max(first_sent + k / rate, made) - made)
            for k, (flood, made, _) in enumerate(rows)
            if not flood
        ]
        stats = {
            "p50": lambda v: percentile(v, 50),
            "p99": lambda v: percentile(v, 99),
            "max": max,
        }
        quiet_name = f"{len(quiet)} quiet clients' rows ({c.fairness_quiet} each)"
        for stat, pick in stats.items():
            self.figure(
                f"fair-quiet-{stat}",
                f"fairness: {quiet_name}, created → SENT, {stat}",
                "ms (lower is better)",
                note=(
                    f"fairness: {c.fairness_clients} clients, all NORMAL; one creates "
                    f"{c.fairness_flood:,} rows, then each other client {c.fairness_quiet}; "
                    f"{c.fairness_workers} workers drain. The ratio column compares the quiet "
                    "clients' wait with what strict oldest-first order would have given (a "
                    "model: every row leaves in creation order at the rate measured, from the "
                    "first row sent)"
                )
                if stat == "p50"
                else "",
                versus=f"fair-fifo-{stat}",
            ).ours.append(pick(quiet_waits))
        for stat, pick in stats.items():
            self.figure(
                f"fair-fifo-{stat}",
                f"fairness: the same, if claimed oldest-first (model), {stat}",
                "ms",
            ).ours.append(pick(fifo_waits))
        for stat, pick in stats.items():
            self.figure(
                f"fair-flood-{stat}",
                f"fairness: the flooding client's rows, created → SENT, {stat}",
                "ms",
            ).ours.append(pick(flood_waits))
        self.figure(
            "fair-quiet-done",
            f"fairness: {quiet_name} all SENT, share of the drain (from the flood's first "
            "create to the last row SENT; oldest-first: 100 %)",
            "% (lower is better)",
        ).ours.append(share)
        self.figure(
            "fair-rate",
            f"fairness: drain rate, {c.fairness_workers} workers, {c.fairness_clients} clients",
            "notifications/s",
        ).ours.append(rate)
        log(
            f"fairness: quiet p50 {percentile(quiet_waits, 50):,.0f} ms, p99 "
            f"{percentile(quiet_waits, 99):,.0f} ms, max {max(quiet_waits):,.0f} ms; flooder p50 "
            f"{percentile(flood_waits, 50):,.0f} ms, max {max(flood_waits):,.0f} ms; quiet all "
            f"SENT at {share:.1f} % of the drain ({quiet_done - start:.1f} of "
            f"{last_sent - start:.1f} s); drain {rate:,.0f}/s; oldest-first would give quiet p50 "
            f"{percentile(fifo_waits, 50):,.0f} ms, max {max(fifo_waits):,.0f} ms"
        )

    def run_times(self, like: str) -> list[tuple[str, float, float | None]]:
        """(key, created, sent) of the rows whose key is LIKE `like`, in seconds of the
        database clock, oldest first."""
        with self.server.connect(DATABASES["ours"]) as conn:
            return conn.execute(
                "SELECT idempotency_key, extract(epoch FROM created_at)::float8, "
                "extract(epoch FROM sent_at)::float8 FROM notification "
                "WHERE idempotency_key LIKE %s ORDER BY created_at, idempotency_key",
                [like],
            ).fetchall()

    def rows_cancel(self, like: str) -> int:
        """Cancels the waiting rows whose key is LIKE `like` (a flood not worth draining)."""
        with self.server.connect(DATABASES["ours"]) as conn:
            return conn.execute(
                "UPDATE notification SET status = 'CANCELLED', updated_at = now() "
                "WHERE idempotency_key LIKE %s AND status = 'PENDING'",
                [like],
            ).rowcount

    def fairness_slow(self, r: int, *, jitter: float) -> None:
        """Claims sized to free send slots: one worker, concurrency 8, an HTTP provider that
        answers after a second (with `jitter`, anywhere in 1 s * (1 +/- jitter), as a real one
        varies; without, every call of a burst ends at the same instant, so the worker's
        slots free in waves a second apart). One client floods `fairness_slow_flood` rows;
        once they fill the slots (and the claims held ready for them),
        `fairness_slow_quiet` other clients create 5 rows each, in one commit. Timed until
        the quiet rows are SENT; the rest of the flood is then cancelled (draining it would
        take minutes and measure nothing more)."""
        c = self.config
        flooder, *others = self.fairness_clients()
        quiet = others[: c.fairness_slow_quiet]
        variant = f"jitter{round(jitter * 100)}" if jitter else "lockstep"
        prefix = f"fslow{variant}{r}"
        quiet_rows = 5
        low, high = c.fairness_slow_delay * (1 - jitter), c.fairness_slow_delay * (1 + jitter)
        answering = (
            f"after {low:g}-{high:g} s" if jitter else f"after exactly {c.fairness_slow_delay:g} s"
        )
        with Provider(c.fairness_slow_delay, jitter=jitter) as provider:
            processes = workers_start(
                c, self.server, 1, until_empty=False, concurrency=8, **http_provider_env(provider)
            )
            time.sleep(3)  # listening before the first create
            log(
                f"fairness, slow provider: client 1 creates {c.fairness_slow_flood} rows, then "
                f"{len(quiet)} clients {quiet_rows} each, all NORMAL; 1 worker, concurrency 8, "
                f"provider answering {answering}"
            )
            flooder.create(f"{prefix}-flood", c.fairness_slow_flood)
            time.sleep(3)  # the flood holds every slot and every claim held ready
            with self.server.connect(DATABASES["ours"]) as conn, conn.transaction():
                for n, rows in enumerate(quiet, 1):  # committed together
                    rows.create(f"{prefix}-quiet{n}", quiet_rows, conn=conn)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                waits = self.run_times(f"{prefix}-quiet%")
                if all(sent is not None for _, _, sent in waits):
                    break
                time.sleep(0.2)
            processes_stop(processes)
            self.provider_check(prefix, provider)
        self.rows_cancel(f"{prefix}-flood-%")
        if any(sent is None for _, _, sent in waits):
            self.problems.append(f"fairness, slow provider, {prefix}: quiet rows not all SENT")
            return
        flood_sent = [
            sent for _, _, sent in self.run_times(f"{prefix}-flood-%") if sent is not None
        ]
        quiet_waits = [1000 * (sent - made) for _, made, sent in waits]
        # Oldest first, the quiet rows would leave after every flood row still unsent when
        # they were created, at the rate the provider allows (8 a second here).
        first_quiet = min(made for _, made, _ in waits)
        ahead = c.fairness_slow_flood - sum(1 for sent in flood_sent if sent <= first_quiet)
        fifo_s = (ahead + len(waits)) / (8 / c.fairness_slow_delay)
        name = f"{len(quiet)} quiet clients' rows ({quiet_rows} each)"
        note = (
            f"fairness on a slow provider: one worker (concurrency 8) and an HTTP provider "
            f"answering {answering}, so nearly every claim is of one row; "
            f"one client's {c.fairness_slow_flood} NORMAL rows fill the slots, then "
            f"{len(quiet)} other clients create {quiet_rows} each. Target: every quiet row "
            "SENT within 3 s of its create"
        )
        for stat, pick in (("p50", lambda v: percentile(v, 50)), ("max", max)):
            self.figure(
                f"fair-slow-{variant}-{stat}",
                f"fairness, slow provider answering {answering}: {name}, created → SENT, {stat}",
                "ms (lower is better)",
                note=note if stat == "p50" else "",
            ).ours.append(pick(quiet_waits))
        if not jitter:
            self.figure(
                "fair-slow-fifo",
                "fairness, slow provider: the last quiet row, if claimed oldest-first (model)",
                "ms",
            ).ours.append(1000 * fifo_s)
        log(
            f"fairness, slow provider {answering}: quiet p50 "
            f"{percentile(quiet_waits, 50):,.0f} ms, max "
            f"{max(quiet_waits):,.0f} ms (target 3,000); oldest-first would send the last "
            f"after about {fifo_s:,.0f} s"
        )

    def fairness_high(self, r: int) -> None:
        """Priority orders a client's own rows only: one client floods `fairness_flood` HIGH
        rows, then each other client creates ten times `fairness_quiet` NORMAL rows (enough
        to keep a backlog of its own for a while), drained by `fairness_workers` workers. The
        others' share of the sends is counted while every client had rows waiting: from the
        last client's first create to the first client's last send. With turns it is the
        others' number over all clients'; with priority deciding between clients it was 0."""
        c = self.config
        flooder, *quiet = self.fairness_clients()
        prefix = f"fairhigh{r}"
        each = 10 * c.fairness_quiet
        processes = workers_start(c, self.server, c.fairness_workers, until_empty=False)
        time.sleep(3)
        log(
            f"fairness, HIGH flood: client 1 creates {c.fairness_flood:,} HIGH rows, then "
            f"{len(quiet)} clients {each} NORMAL each; {c.fairness_workers} workers"
        )
        self.server.checkpoint()
        flooder.create(f"{prefix}-flood", c.fairness_flood, priority=1)
        with self.server.connect(DATABASES["ours"]) as conn, conn.transaction():
            for n, rows in enumerate(quiet, 1):  # committed together
                rows.create(f"{prefix}-quiet{n}", each, conn=conn)
        deadline = time.monotonic() + 900
        while (
            sum(rows.waiting(prefix) for rows in (flooder, *quiet)) and time.monotonic() < deadline
        ):
            time.sleep(0.5)
        processes_stop(processes)
        rows = self.run_times(f"{prefix}-%")
        total = c.fairness_flood + len(quiet) * each
        if len(rows) != total or any(sent is None for _, _, sent in rows):
            self.problems.append(f"fairness, HIGH flood, run {r}: not every row SENT")
            return
        by_client: dict[str, list[tuple[float, float]]] = {}
        for key, made, sent in rows:
            by_client.setdefault(key.rsplit("-", 1)[0], []).append((made, sent))
        start = max(min(made for made, _ in times) for times in by_client.values())
        end = min(max(sent for _, sent in times) for times in by_client.values())
        flood = f"{prefix}-flood"
        window = [
            client
            for client, times in by_client.items()
            for _, sent in times
            if start <= sent <= end
        ]
        share = 100 * sum(1 for client in window if client != flood) / max(1, len(window))
        quiet_waits = [
            1000 * (sent - made)
            for client, times in by_client.items()
            if client != flood
            for made, sent in times
        ]
        self.figure(
            "fair-high-share",
            f"fairness, HIGH flood: the {len(quiet)} NORMAL clients' share of the sends while "
            f"every client had rows waiting (turns: {100 * len(quiet) / (len(quiet) + 1):.0f} "
            "%; priority between clients: 0 %)",
            "% (target ≥ 50)",
            note=(
                f"fairness, HIGH flood: {c.fairness_clients} clients; one creates "
                f"{c.fairness_flood:,} HIGH rows, then each other client {each} NORMAL ones; "
                f"{c.fairness_workers} workers drain"
            ),
        ).ours.append(share)
        self.figure(
            "fair-high-quiet-p50",
            "fairness, HIGH flood: the NORMAL clients' rows, created → SENT, p50",
            "ms (lower is better)",
        ).ours.append(percentile(quiet_waits, 50))
        log(
            f"fairness, HIGH flood: the NORMAL clients had {share:.0f} % of the sends while "
            f"every client had rows waiting ({len(window)} sends, {end - start:.1f} s); their "
            f"rows waited p50 {percentile(quiet_waits, 50):,.0f} ms, max "
            f"{max(quiet_waits):,.0f} ms"
        )

    def aging(self) -> None:
        """Priority aging under a HIGH flood. One client; one worker (concurrency 8) and an
        HTTP provider answering after 100 ms. The drain rate is measured first; then, for
        each load (100 % and 120 % of it) and aging period (`aging_period` s, and 0: off),
        HIGH rows arrive at that rate for `aging_seconds`, with one LOW row every 2 s from
        the first second on, and every row is timed to SENT. Run once, whatever --repeats."""
        c = self.config
        [rows] = self.aging_rows()
        delay_s, concurrency = 0.1, 8
        with Provider(delay_s) as provider:
            env = http_provider_env(provider)
            processes = workers_start(
                c, self.server, 1, until_empty=False, concurrency=concurrency, **env
            )
            time.sleep(3)
            rows.create("aging-rate", 600, priority=1)
            while rows.waiting("aging-rate"):
                time.sleep(0.2)
            processes_stop(processes)
            sent = sorted(s for _, _, s in self.run_times("aging-rate-%"))
            middle = sent[100:500]  # the steady part, without the start and the tail
            rate = (len(middle) - 1) / (middle[-1] - middle[0])
            log(f"aging: the drain rate is {rate:,.0f}/s (1 worker, concurrency 8, 100 ms)")
            for load in (1.0, 1.2):
                for period in (c.aging_period, 0.0):
                    self.aging_run(rows, provider, rate, load, period, concurrency)

    def aging_rows(self) -> list[Rows]:
        """The aging run's one client, made on first use."""
        if not self.aging_clients:
            self.aging_clients = self.clients_create(["aging"])
        return self.aging_clients

    def aging_run(
        self,
        rows: Rows,
        provider: Provider,
        rate: float,
        load: float,
        period: float,
        concurrency: int,
    ) -> None:
        c = self.config
        prefix = f"aging{round(load * 100)}p{period:g}"
        processes = workers_start(
            c,
            self.server,
            1,
            until_empty=False,
            concurrency=concurrency,
            NOTIFYQUEUE_PRIORITY_AGING_SECONDS=str(period),
            **http_provider_env(provider),
        )
        time.sleep(3)
        started = time.monotonic()
        made = batches = lows = 0
        while (elapsed := time.monotonic() - started) < c.aging_seconds:
            due = round(load * rate * elapsed) - made
            if due > 0:
                rows.create(f"{prefix}-high{batches}", due, priority=1)
                made += due
                batches += 1
            if elapsed >= 1 + 2 * lows:
                rows.create(f"{prefix}-low{lows}", 1, priority=3)
                lows += 1
            time.sleep(0.02)
        deadline = time.monotonic() + 120
        while rows.waiting(prefix) and time.monotonic() < deadline:
            time.sleep(0.2)
        processes_stop(processes)
        times = self.run_times(f"{prefix}-%")
        if any(sent is None for _, _, sent in times):
            self.problems.append(f"aging {prefix}: not every row SENT")
            return
        low = [(made, sent) for key, made, sent in times if "-low" in key]
        high = [(made, sent) for key, made, sent in times if "-high" in key]
        low_waits = [1000 * (sent - made) for made, sent in low]
        high_waits = [1000 * (sent - made) for made, sent in high]
        # Each LOW row still waiting when it became HIGH (two periods past its due time)
        # against the HIGH rows created within 100 ms of that moment: how much later it was
        # sent than they were.
        behind = []
        if period:
            for made, sent in low:
                promoted = made + 2 * period
                if sent < promoted:
                    continue
                peers = [s for m, s in high if promoted <= m <= promoted + 0.1]
                if peers:
                    behind.append(1000 * (sent - statistics.median(peers)))
        label = f"{round(load * 100)} % of the drain rate, aging " + (
            f"{period:g} s" if period else "off"
        )
        key = f"aging-{round(load * 100)}-{'on' if period else 'off'}"
        self.figure(
            f"{key}-low",
            f"aging: LOW rows under a HIGH flood at {label}, created → SENT, max",
            "ms",
            note=(
                f"aging: one client, 1 worker (concurrency {concurrency}), an HTTP provider "
                f"answering after 100 ms; HIGH rows arrive at the load shown for "
                f"{c.aging_seconds:g} s, one LOW row every 2 s among them; "
                "NOTIFYQUEUE_PRIORITY_AGING_SECONDS as shown. Measured once"
            )
            if key == "aging-100-on"
            else "",
        ).ours.append(max(low_waits))
        self.figure(
            f"{key}-high", f"aging: the HIGH rows at {label}, created → SENT, max", "ms"
        ).ours.append(max(high_waits))
        if behind:
            self.figure(
                f"{key}-behind",
                f"aging: at {label}, a LOW row SENT after the HIGH rows created as it became "
                "HIGH, worst (≤ 0: no later than they)",
                "ms",
            ).ours.append(max(behind))
        log(
            f"aging at {label}: LOW waited p50 {percentile(low_waits, 50):,.0f} ms, max "
            f"{max(low_waits):,.0f} ms; HIGH p50 {percentile(high_waits, 50):,.0f} ms, max "
            f"{max(high_waits):,.0f} ms"
            + (
                f"; LOW after the HIGH made at its promotion: {max(behind):,.0f} ms"
                if behind
                else ""
            )
        )

    def latency(self, r: int) -> None:
        c = self.config
        prefix = f"latency{r}"
        with Provider(0.0) as provider:
            processes = workers_start(
                c, self.server, 1, until_empty=False, **http_provider_env(provider)
            )
            time.sleep(3)  # the worker is listening before the first create
            self.server.checkpoint()
            with self.server.connect(DATABASES["ours"]) as conn:
                counted, dead, live = conn.execute(
                    "SELECT reltuples::bigint, pg_stat_get_dead_tuples('notification_queue'::"
                    "regclass), pg_stat_get_live_tuples('notification_queue'::regclass) "
                    "FROM pg_class WHERE oid = 'notification'::regclass"
                ).fetchone()
            # Under 10,000 the claim and the finish are planned on every call (delivery 0018);
            # a queue of dead rows is stepped over by every claim until vacuumed.
            log(
                f"latency: the record's statistics count {counted:,} rows; the queue holds "
                f"{live:,} live and {dead:,} dead rows"
            )
            # The API's and every backend's (the worker's too): what a notification costs at
            # a steady trickle, where each claim takes a row or two.
            meter = CpuMeter(self.server, self.api)
            meter.start()
            total = steady_creates(c, self.api_key, prefix)
            deadline = time.monotonic() + 60
            while self.rows.waiting(prefix) and time.monotonic() < deadline:
                time.sleep(0.2)
            self.cpu_note("latency", meter.stop(total), per="notification created and sent")
            processes_stop(processes)
            with self.server.connect(DATABASES["ours"]) as conn:
                created = conn.execute(
                    "SELECT id::text, idempotency_key, extract(epoch FROM created_at) "
                    "FROM notification WHERE idempotency_key LIKE %s",
                    [f"{prefix}-%"],
                ).fetchall()
            seen = {k.split(":")[0]: v for k, v in provider.first_seen.items()}
            # The warm-up's creates (the first latency_warmup seconds) are sent, not counted.
            warmup = int(c.latency_rate * c.latency_warmup)
            counted = [(i, t) for i, key, t in created if int(key.rsplit("-", 1)[1]) >= warmup]
            waits = [1000 * (seen[i] - float(t)) for i, t in counted if i in seen]
            self.provider_check(prefix, provider)
        if len(seen) < total:
            self.problems.append(
                f"latency run {r}: {total - len(seen)} of {total} never reached the provider"
            )
        for p in (50, 95, 99):
            f = self.figure(
                f"latency-p{p}",
                f"created → provider call at {c.latency_rate:.0f}/s, p{p}",
                "ms (lower is better)",
            )
            f.ours.append(percentile(waits, p))
        log(
            f"latency at {c.latency_rate:.0f}/s: p50 {percentile(waits, 50):.1f} ms, "
            f"p95 {percentile(waits, 95):.1f} ms, p99 {percentile(waits, 99):.1f} ms"
        )
        for system in PEERS:
            peer_empty(self.server, system)
            self.server.checkpoint()
            got = peer_run(
                self.server,
                "latency",
                system,
                "--rate",
                str(c.latency_rate),
                "--seconds",
                str(c.latency_seconds),
                "--warmup",
                str(c.latency_warmup),
            )
            for p in (50, 95, 99):
                self.figures[f"latency-p{p}"].peers.setdefault(system, []).append(got[f"p{p}_ms"])
            log(
                f"  {system}: p50 {got['p50_ms']:.1f} ms, p95 {got['p95_ms']:.1f} ms, "
                f"p99 {got['p99_ms']:.1f} ms"
            )

    def history(self) -> None:
        c = self.config
        log(f"history: {c.history_rows:,} finished (SENT) rows")
        self.rows.finished_create("history", c.history_rows)
        f = self.figure(
            "history",
            f"drain, 1 worker, with {c.history_rows:,} finished rows",
            "notifications/s",
            note="target ≥ 0.9 x the empty-table drain; the ratio column compares with it",
        )
        f.versus = "drain-1"
        for r in range(c.repeats):
            rate = self.drain_ours(f"history{r}drain", 1)
            f.ours.append(rate)
            log(f"{f.name}: {rate:,.0f}/s")

    def backlog(self) -> None:
        """One recipient far over its rate limit does not slow the others: the drain of
        `drain_rows` rows (one worker, simulated provider, every row its own recipient) with
        no backlog, then beside one recipient of another client with `backlog_held` rows held
        by its rate limit (the default 10 an hour). The held rows are made as production
        makes them: written due now, then a worker claims them, sends ten and defers the
        rest, a bounded chunk a step, each row into its slot, one slot apart, years ahead
        (notification_rate_defer_many). Then the time of one deferral beside them: a new row
        for the recipient, claimed and deferred."""
        c = self.config
        plain = self.figure(
            "backlog-none",
            "drain, 1 worker, simulated provider, no recipient over its limit",
            "notifications/s",
        )
        held = self.figure(
            "backlog-held",
            f"the same beside one recipient with {c.backlog_held:,} rows held by its rate limit",
            "notifications/s",
            note="target ≥ 0.9 x the same drain without the held rows; the ratio column "
            "compares with it",
        )
        held.versus = "backlog-none"
        for r in range(c.repeats):
            rate = self.drain_ours(f"bkdrain{r}n", 1)
            plain.ours.append(rate)
            log(f"{plain.name}: {rate:,.0f}/s, load average {os.getloadavg()[0]:.1f}")
        [backlogged] = self.clients_create(["backlogged"])
        recipient = "held@example.com"
        log(f"backlog: {c.backlog_held:,} rows for {recipient}, then one worker holds them")
        with self.server.connect(DATABASES["ours"]) as conn:
            conn.execute(
                """
                INSERT INTO notification (id, client_id, idempotency_key, request_fingerprint,
                    channel, recipient, subject, body, priority, metadata, fallback_channels,
                    status, send_at, due_at, attempt_count, max_attempts, operator_retries,
                    created_at, updated_at)
                SELECT notifyqueue_uuid7(), %s, 'held-' || g, '', 'email', %s, 'Hi', 'Body', 2,
                       '{}', '[]', 'PENDING', now(), now(), 0, 6, 0, now(), now()
                  FROM generate_series(1, %s) AS g
                """,
                [backlogged.client_id, recipient, c.backlog_held],
            )
            vacuum_analyze(conn)
            processes = workers_start(
                c,
                self.server,
                1,
                until_empty=False,
                concurrency=1,
            )
            due = (
                "SELECT count(*) FROM notification_queue WHERE client_id = %s "
                "AND (status = 'PROCESSING' OR (status = 'PENDING' AND due_at <= now()))"
            )
            deadline = time.monotonic() + 300
            while conn.execute(due, [backlogged.client_id]).fetchone()[0]:
                if time.monotonic() > deadline:
                    raise SystemExit("backlog: the held recipient's rows were never deferred")
                time.sleep(0.5)
            processes_stop(processes)
            waiting, first_due = conn.execute(
                "SELECT count(*), min(due_at) - now() FROM notification_queue "
                "WHERE client_id = %s AND status = 'PENDING'",
                [backlogged.client_id],
            ).fetchone()
            vacuum_analyze(conn)
            log(f"backlog: {waiting:,} rows held, the first due in {first_due}")
            deferral = self.figure(
                "backlog-defer",
                f"one deferral of a new row beside the {waiting:,} held rows",
                "ms",
                note="a row for the held recipient, claimed, then deferred through "
                "notification_rate_defer (the rate limiter's statement for one claim)",
            )
            for r in range(c.repeats):
                deferral.ours.append(self.backlog_deferral_ms(conn, backlogged, recipient, r))
                log(f"{deferral.name}: {deferral.ours[-1]:,.1f} ms")
        for r in range(c.repeats):
            rate = self.drain_ours(f"bkdrain{r}h", 1)
            held.ours.append(rate)
            log(f"{held.name}: {rate:,.0f}/s, load average {os.getloadavg()[0]:.1f}")
        arriving = self.figure(
            "backlog-arriving",
            "the same while the held recipient gets a new notification every 5 s",
            "notifications/s",
            note="each new row is claimed, refused by the limit and deferred into the slot "
            "after the last one handed out; the ratio column compares with the drain without "
            "the held rows",
        )
        arriving.versus = "backlog-none"
        for r in range(c.repeats):
            stop = threading.Event()

            def arrive(r: int = r, stop: threading.Event = stop) -> None:
                with self.server.connect(DATABASES["ours"]) as conn:
                    n = 0
                    while not stop.wait(5.0):
                        n += 1
                        conn.execute(
                            """
                            INSERT INTO notification (id, client_id, idempotency_key,
                                request_fingerprint, channel, recipient, subject, body,
                                priority, metadata, fallback_channels, status, send_at, due_at,
                                attempt_count, max_attempts, operator_retries, created_at,
                                updated_at)
                            VALUES (notifyqueue_uuid7(), %s, %s, '', 'email', %s, 'Hi', 'Body',
                                    2, '{}', '[]', 'PENDING', now(), now(), 0, 6, 0, now(),
                                    now())
                            """,
                            [backlogged.client_id, f"heldnew{r}-{n}", recipient],
                        )

            arrivals = threading.Thread(target=arrive, daemon=True)
            arrivals.start()
            try:
                rate = self.drain_ours(f"bkdrain{r}a", 1)
            finally:
                stop.set()
                arrivals.join(10)
            arriving.ours.append(rate)
            log(f"{arriving.name}: {rate:,.0f}/s, load average {os.getloadavg()[0]:.1f}")

    def backlog_deferral_ms(self, conn, client, recipient: str, r: int) -> float:
        """A new row for the held recipient, claimed (nothing else is due) and deferred by the
        rate limiter's statement for one claim at the backlog run's limit; milliseconds."""
        conn.execute(
            """
            INSERT INTO notification (id, client_id, idempotency_key, request_fingerprint,
                channel, recipient, subject, body, priority, metadata, fallback_channels,
                status, send_at, due_at, attempt_count, max_attempts, operator_retries,
                created_at, updated_at)
            VALUES (notifyqueue_uuid7(), %s, %s, '', 'email', %s, 'Hi', 'Body', 2, '{}', '[]',
                    'PENDING', now(), now(), 0, 6, 0, now(), now())
            """,
            [client.client_id, f"heldtimed{r}", recipient],
        )
        row_id, token = conn.execute(
            "SELECT id, claim_token FROM notification_claim_due_many(1, 'bench', 30)"
        ).fetchone()
        started = time.perf_counter()
        conn.execute(
            "SELECT due_at FROM notification_rate_defer('email', %s, %s, %s, %s, %s, %s)",
            [client.client_id, recipient, row_id, token, BACKLOG_LIMIT, BACKLOG_WINDOW_S],
        ).fetchone()
        return (time.perf_counter() - started) * 1000

    def scale(self, r: int) -> None:
        """The same drain at 1, 2, 4 ... worker processes, every one through one PgBouncer in
        transaction mode (their LISTEN sessions direct, as production's must be), each with
        its own connections and worker id as on separate hosts, against an HTTP provider
        answering after exactly `scale_latency_s`: the ideal rate is workers x concurrency /
        latency, so a step below it measures what the workers cost each other and the
        server, not the provider. Workers start and are ready before the rows are created
        (one commit, which wakes them all). Each step reports the rows per second, how far
        from the ideal, the claims' share of rows stepped over (claim_counted_sql), rows per
        claim, PostgreSQL's and the workers' CPU per row and the load average."""
        c = self.config
        with (
            self.server.connect(DATABASES["ours"]) as conn,
            PgBouncer(self.server, DATABASES["ours"], c.scale_pool) as bouncer,
            Provider(c.scale_latency_s) as provider,
        ):
            claim_counters_install(conn)
            if not self.scale_rows:
                # Finished rows, as any installation has: with fewer than 10,000 records the
                # claim is planned at every call (notification_claim_due_many.sql), which is
                # an empty table's cost, not production's.
                notifications_insert(
                    conn, self.rows.client_id, "planhistory", 20_000, status="SENT"
                )
                vacuum_analyze(conn)
            try:
                for workers in c.scale_workers:
                    self.scale_step(r, workers, conn, bouncer, provider)
            finally:
                claim_counters_remove(conn)
            if bouncer.complaints():
                self.problems.append(f"pgbouncer complained: {bouncer.complaints()[:5]}")

    def scale_step(
        self,
        r: int,
        workers: int,
        conn: psycopg.Connection,
        bouncer: PgBouncer,
        provider: Provider,
    ) -> None:
        c = self.config
        ideal = workers * c.scale_concurrency / c.scale_latency_s
        f = self.figure(
            f"scale-{workers}",
            f"drain, {workers} worker{'s' if workers > 1 else ''} through PgBouncer "
            f"(transaction mode, {c.scale_pool} server connections), concurrency "
            f"{c.scale_concurrency} each, http provider answering after "
            f"{c.scale_latency_s * 1000:.0f} ms",
            "notifications/s",
            note=f"ideal {ideal:,.0f}/s (workers x concurrency / latency); the ratio column "
            "compares with 1 worker",
        )
        if workers != c.scale_workers[0]:
            f.versus = f"scale-{c.scale_workers[0]}"
        prefix = f"scale{r}w{workers}"
        total = max(200, int(ideal * c.scale_seconds))
        processes = workers_start(
            c,
            self.server,
            workers,
            until_empty=False,
            concurrency=c.scale_concurrency,
            DATABASE_URL=bouncer.url,
            NOTIFYQUEUE_LISTEN_DATABASE_URL=self.server.url(DATABASES["ours"]),
            **http_provider_env(provider),
        )
        workers_ready(self.server, processes, timeout=120)
        self.server.checkpoint()
        before = claim_counters_read(conn)
        backends = self.backends(conn)
        cpu_before = cpu_seconds(backends)
        load_before = os.getloadavg()[0]
        keys_before = len(provider.calls)
        # The workers' CPU: what their whole lives cost (the children's rusage once they are
        # waited for) less what they had spent by now (starting up, idling).
        started_cpu = sum(cpu_seconds([p.pid for p in processes]).values())
        children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.rows.create(prefix, total)
        rate = drain_timed(lambda: self.rows.waiting(prefix), total, processes)
        children_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        workers_cpu = (
            children_after.ru_utime
            + children_after.ru_stime
            - children_before.ru_utime
            - children_before.ru_stime
            - started_cpu
        )
        after = claim_counters_read(conn)
        if len(provider.calls) - keys_before != total:
            self.problems.append(
                f"{prefix}: the http provider was asked for "
                f"{len(provider.calls) - keys_before:,} new keys, not {total:,}"
            )
        backends = sorted(set(backends) | set(self.backends(conn)))
        pg_cpu = sum(used - cpu_before.get(pid, 0.0) for pid, used in cpu_seconds(backends).items())
        self.provider_check(prefix, provider)
        claims, seen, locked, taken = (after[k] - before[k] for k in CLAIM_COUNTERS)
        skipped, stale = seen - locked, locked - taken
        share = (skipped + stale) / seen if seen else 0.0
        f.ours.append(rate)
        self.scale_rows.append(
            (
                workers,
                rate,
                ideal,
                claims,
                total / max(claims, 1),
                share,
                skipped,
                stale,
                1000 * pg_cpu / total,
                1000 * workers_cpu / total,
                f"{load_before:.1f}-{os.getloadavg()[0]:.1f}",
            )
        )
        log(
            f"{f.name}: {rate:,.0f}/s ({rate / ideal:.0%} of the ideal {ideal:,.0f}/s); "
            f"{claims:,} claims, {total / max(claims, 1):.1f} rows a claim; of {seen:,} rows "
            f"the claims' scans met, {skipped:,} skipped locked and {stale:,} already taken "
            f"({share:.1%} stepped over); PostgreSQL "
            f"{1000 * pg_cpu / total:.2f} ms CPU a row, the workers "
            f"{1000 * workers_cpu / total:.2f} ms; load average {os.getloadavg()[0]:.1f}"
        )

    def backends(self, conn: psycopg.Connection) -> list[int]:
        """The server processes serving our database: PgBouncer's pool among them."""
        return [
            pid
            for (pid,) in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (DATABASES["ours"],),
            ).fetchall()
        ]

    def scale_print(self) -> None:
        if not self.scale_rows:
            return
        print(
            "\nscale run, each step: workers | rows/s | % of ideal | claims | rows a claim | "
            "share of the rows the claims met that they stepped over (skipped locked + already "
            "taken) | CPU ms a row: PostgreSQL, the workers | load average (start-end)"
        )
        for row in self.scale_rows:
            workers, rate, ideal, claims, per, share, skipped, stale, cpu, wcpu, load = row
            print(
                f"| {workers} | {rate:,.0f} | {rate / ideal:.0%} | {claims:,} | {per:.1f} | "
                f"{share:.1%} ({skipped:,} + {stale:,}) | {cpu:.2f}, {wcpu:.2f} | {load} |"
            )

    def webhook_clients(self) -> list[Rows]:
        """The webhook runs' clients (made with create_client); each run points their
        webhook URL at its own receiver."""
        if not self.hook_rows:
            self.hook_rows = self.clients_create([f"hooks-{n}" for n in range(WEBHOOK_CLIENTS)])
        return self.hook_rows

    def webhook_loop(self, r: int) -> None:
        """The machine's limit for the webhook rows' work: a bare loop of signed keep-alive
        POSTs (bench/webhook_loop.py, its own process) to a receiver like theirs, with as many
        in flight as one client may have (NOTIFYQUEUE_WEBHOOK_CLIENT_CONCURRENCY, 4)."""
        c = self.config
        in_flight = 4
        f = self.figure(
            "webhook-loop",
            f"bare loop: signed keep-alive POSTs, {in_flight} in flight, receiver answering "
            "at once (no queue)",
            "POSTs/s",
        )
        with Provider(0) as receiver:
            got = json.loads(
                subprocess.run(
                    [
                        sys.executable,
                        str(BENCH / "webhook_loop.py"),
                        "--url",
                        receiver.url,
                        "--in-flight",
                        str(in_flight),
                        "--events",
                        str(c.webhook_rows),
                    ],
                    check=True,
                    capture_output=True,
                    text=True,
                    timeout=600,
                ).stdout
            )
            if len(receiver.calls) != c.webhook_rows or got["failures"]:
                self.problems.append(
                    f"webhook loop {r}: the receiver saw {len(receiver.calls):,} of "
                    f"{c.webhook_rows:,} POSTs, {got['failures']} not 2xx"
                )
        f.ours.append(got["rate"])
        log(f"{f.name}: {got['rate']:,.0f}/s")

    def webhooks(self, r: int, clients: int) -> None:
        """One worker delivers `webhook_rows` notifications of `clients` clients, each with a
        webhook URL, and its sender POSTs their events to a receiver on 127.0.0.1 that answers
        at once: events per second from the first event delivered until the last. A
        notification waits in the queue, then its event in the webhook queue (written by the
        finish that sent it), so their sum falls only as events are delivered; the drain of
        the notifications themselves (about 1 % of the time) is inside the figure."""
        c = self.config
        f = self.figure(
            f"webhooks-{clients}",
            f"webhooks, 1 worker, {clients} client{'s' if clients > 1 else ''} with a webhook "
            "URL, receiver answering at once",
            "events/s",
            note="each client has at most NOTIFYQUEUE_WEBHOOK_CLIENT_CONCURRENCY (4) POSTs in "
            "flight; the ratio column compares one client with the bare loop (target >= 0.8x), "
            "four clients with one (target >= 1.5x)",
        )
        f.versus = "webhook-loop" if clients == 1 else "webhooks-1"
        each = c.webhook_rows // clients
        hooked = self.webhook_clients()[:clients]
        ids = [rows.client_id for rows in hooked]
        prefix = f"hooks{clients}r{r}"
        with Provider(0) as receiver:
            with self.server.connect(DATABASES["ours"]) as conn:
                conn.execute(
                    "UPDATE clients_client SET webhook_url = %s WHERE id = ANY(%s::uuid[])",
                    [receiver.url, ids],
                )
            processes = workers_start(
                c, self.server, 1, until_empty=False, NOTIFYQUEUE_WEBHOOK_ALLOW_PRIVATE="true"
            )
            workers_ready(self.server, processes)
            self.server.checkpoint()
            for n, rows in enumerate(hooked):
                rows.create(f"{prefix}-{n}", each)
            rate = drain_timed(
                lambda: self.rows.poll.count(
                    "SELECT (SELECT count(*) FROM notification_queue"
                    "        WHERE client_id = ANY(%(ids)s::uuid[]) AND status = 'PENDING')"
                    "     + (SELECT count(*) FROM notification_queue"
                    "        WHERE client_id = ANY(%(ids)s::uuid[]) AND status = 'PROCESSING')"
                    "     + (SELECT count(*) FROM webhook_queue"
                    "        WHERE client_id = ANY(%(ids)s::uuid[]))",
                    {"ids": ids},
                ),
                each * clients,
                processes,
            )
            if len(receiver.calls) != each * clients:
                self.problems.append(
                    f"{prefix}: the receiver saw {len(receiver.calls):,} events of "
                    f"{each * clients:,}"
                )
            repeated = sum(1 for n in receiver.calls.values() if n > 1)
            if repeated:
                self.checks.append(
                    f"{prefix}: {repeated} events were POSTed more than once (webhooks are at "
                    "least once; receivers deduplicate by webhook-id)"
                )
        f.ours.append(rate)
        log(f"{f.name}: {rate:,.0f}/s")

    def provider_check(self, prefix: str, provider: Provider) -> None:
        repeated = sum(1 for k, n in provider.calls.items() if n > 1)
        if repeated:
            self.checks.append(
                f"{prefix}: the http provider was called more than once for "
                f"{repeated} keys (a retry with the same idempotency key: "
                "it answered as the first time and sent nothing new)"
            )

    def exactly_once_check(self) -> None:
        """Every notification the benchmark delivered is SENT, with one successful attempt
        and (simulated provider) one send."""
        delivered = (
            "drain%",
            "quiet%",
            "slow%",
            "fair%",
            "fslow%quiet%",
            "aging%",
            "hooks%",
            "latency%",
            "history%drain%",
            "scale%",
            "bkdrain%",
        )
        with self.server.connect(DATABASES["ours"]) as conn:
            where = " OR ".join("n.idempotency_key LIKE %s" for _ in delivered)
            total, not_sent = conn.execute(
                f"SELECT count(*), count(*) FILTER (WHERE n.status <> 'SENT') "
                f"FROM notification AS n WHERE {where}",
                delivered,
            ).fetchone()
            if not_sent:
                self.problems.append(f"{not_sent} of {total} notifications are not SENT")
            tables = {
                r[0]
                for r in conn.execute(
                    "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
                ).fetchall()
            }
            if "delivery_attempt" in tables:
                (wrong,) = conn.execute(
                    f"""
                    SELECT count(*) FROM (
                        SELECT n.id, count(a.id) FILTER (WHERE a.outcome = 'SENT') AS sent
                          FROM notification AS n
                          LEFT JOIN delivery_attempt AS a ON a.notification_id = n.id
                         WHERE {where}
                         GROUP BY n.id) AS x
                     WHERE sent <> 1
                    """,
                    delivered,
                ).fetchone()
                if wrong:
                    self.problems.append(
                        f"{wrong} notifications do not have exactly one SENT attempt"
                    )
            else:
                self.checks.append("no delivery_attempt table: attempts not checked")
            columns = {
                r[0]
                for r in conn.execute(
                    "SELECT column_name FROM information_schema.columns "
                    "WHERE table_name = 'simulated_provider_message'"
                ).fetchall()
            }
            if {"idempotency_key", "sends"} <= columns:
                (wrong,) = conn.execute(
                    f"""
                    SELECT count(*) FROM notification AS n
                      LEFT JOIN simulated_provider_message AS m
                        ON m.idempotency_key = n.id::text || ':' || n.channel
                     WHERE ({where}) AND n.idempotency_key NOT LIKE 'slow%%'
                       AND n.idempotency_key NOT LIKE 'latency%%'
                       AND n.idempotency_key NOT LIKE 'fslow%%'
                       AND n.idempotency_key NOT LIKE 'aging%%'
                       AND n.idempotency_key NOT LIKE 'scale%%'
                       AND coalesce(m.sends, 0) <> 1
                    """,
                    delivered,
                ).fetchone()
                if wrong:
                    self.problems.append(
                        f"{wrong} notifications were not sent exactly once by "
                        "the simulated provider"
                    )
            else:
                self.checks.append(
                    "the simulated provider's store has no idempotency_key and "
                    "sends columns: its sends were not checked"
                )
        self.checks.insert(0, f"{total:,} notifications delivered by the benchmark")

    def report(self) -> None:
        c = self.config
        print(
            f"\nNotify Queue benchmark: {c.repeats} repeat(s); medians with (min-max); "
            "each ratio is ours / peer, the median of per-repeat ratios, the two measured "
            "back to back. For ms, lower is better."
        )
        table_print(self.figures)
        self.scale_print()
        print()
        print(f"machine at the start: {self.speeds[0]}; at the end: {self.speeds[-1]}")
        for key, notes in self.cpu.items():
            print(f"cpu: {key}, each repeat: {'; '.join(notes)}")
        for line in self.checks:
            print(f"check: {line}")
        if self.problems:
            for line in self.problems:
                print(f"PROBLEM: {line}")
            print("exactly-once check FAILED")
            raise SystemExit(1)
        print(
            "exactly-once check passed: every notification delivered by the benchmark is "
            "SENT, with exactly one SENT attempt and (simulated provider) one send"
        )


def main(argv: list[str]) -> int:
    config = config_parse(argv)
    if shutil.which("wrk") is None and config.sections & {"ingest"}:
        raise SystemExit(
            "wrk is not installed: `apt-get install wrk` (python3 dev.py bench "
            "installs it when run as root)"
        )
    try:
        Bench(config).run()
    finally:
        processes_stop([p for p in _STARTED if p.poll() is None], timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
