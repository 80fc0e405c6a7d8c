#!/usr/bin/env python3
"""Sets up everything Notify Queue needs, then runs it or tests it.

    python3 dev.py serve   # API on http://127.0.0.1:8000 (HOST, PORT) plus one worker
    python3 dev.py test    # lint, import layers, migrations check, all tests (args go to pytest)
    python3 dev.py bench   # the benchmark beside procrastinate and pgqueuer (--help, --quick)
    python3 dev.py notifyqueue queue_status   # any `notifyqueue` command, on the same database
    python3 dev.py stop    # stop a left-over embedded PostgreSQL

Needs only Python 3.11+ and pip: it creates `.venv/`, installs the project into it, and (when
DATABASE_URL is unset) starts the embedded PostgreSQL under `.notifyqueue/`, passes it to
every process it starts (with the development switch NOTIFYQUEUE_DEV_EMBEDDED_DB=1), and
stops it again when it ends. Ctrl-C or SIGTERM stops everything it started; it then exits 130
or 143, never 0.

`test` also installs the Debian packages its tests use when they are missing (chromium,
faketime, pgbouncer, and PostgreSQL's own server), as root with apt-get: it prints what it will
install first, installs no recommended packages and upgrades nothing (if that would need an
upgrade it installs nothing), and leaves any service those packages bring stopped and disabled.
NOTIFYQUEUE_DEV_NO_APT=1 turns that off; the tests that need a missing package then skip and
say so.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import http.server
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import venv
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PYTHON = VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
# The demo key, the admin password and the metrics folder (the embedded database always lives
# in .notifyqueue/); tests point it elsewhere.
STATE = Path(os.environ.get("NOTIFYQUEUE_DEV_STATE_DIR", ROOT / ".notifyqueue"))
DEMO_CLIENT = "demo"
DEMO_KEY_FILE = STATE / "demo-api-key"
ADMIN_USER = "operator"
ADMIN_PASSWORD_FILE = STATE / "demo-admin-password"
METRICS_DIR = STATE / "metrics"
# Debian packages the tests use, by a file each installs (PostgreSQL's own server: the embedded
# database on a Python without pgserver, and tests/integration/test_embedded_db_system.py).
TEST_PACKAGES = {
    "chromium": "/usr/bin/chromium",
    "faketime": "/usr/lib/*/faketime/libfaketimeMT.so.1",
    "pgbouncer": "/usr/sbin/pgbouncer",
    "postgresql": "/usr/lib/postgresql/*/bin/initdb",
}
# Where Debian looks for the script that may forbid starting services during an install.
POLICY_RC_D = Path("/usr/sbin/policy-rc.d")
API_WORKERS = 2
STARTUP_TIMEOUT_S = 60
# A webhook event is a few hundred bytes; `serve --webhooks` prints at most this much of one.
WEBHOOK_PRINT_MAX_BYTES = 4096


class Stopped(Exception):
    """SIGTERM or SIGINT arrived: stop everything that was started."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def main(argv: list[str]) -> int:
    command, args = (argv[1], argv[2:]) if len(argv) > 1 else ("", [])
    if command == "stop":
        return stop()
    commands = {"serve": serve, "test": test, "bench": bench, "notifyqueue": notifyqueue}
    if command not in commands:
        print(__doc__.strip())
        return 2
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _raise_stopped)
    try:
        ensure_installed()
        if command == "test":
            # Before the database: on a Python without pgserver it is PostgreSQL's own server.
            ensure_test_packages()
        with development_environment(benchmark=command == "bench") as env:
            return commands[command](args, env)
    except Stopped as stopped:
        # As a shell reports a command a signal ended (130 for Ctrl-C, 143 for SIGTERM): an
        # interrupted run is never a success.
        print(f"dev.py {command}: stopped by {stopped}.", file=sys.stderr)
        return 128 + stopped.signum


def _raise_stopped(signum, frame):
    raise Stopped(signum)


def ensure_installed() -> None:
    """Creates the virtualenv and installs the project once per change of pyproject.toml."""
    if not PYTHON.exists():
        print(f"Creating {VENV} ...", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]
    stamp = VENV / f".installed-{digest}"
    if stamp.exists():
        return
    print("Installing Notify Queue and its dependencies into .venv ...", flush=True)
    run([PYTHON, "-m", "pip", "install", "--quiet", "--upgrade", "pip"])
    run([PYTHON, "-m", "pip", "install", "--quiet", "-e", f"{ROOT}[dev]"])
    for old in VENV.glob(".installed-*"):
        old.unlink()
    stamp.touch()


@contextlib.contextmanager
def development_environment(*, benchmark: bool = False) -> Iterator[dict[str, str]]:
    """The environment for every process dev.py starts: the development switch and a database.

    Without DATABASE_URL it starts the embedded PostgreSQL (for a benchmark, with checkpoints
    spaced as PostgreSQL's defaults do), and stops it on the way out if it was not already
    running and nothing else (another dev.py in this checkout) uses it.
    """
    env = {**os.environ, "NOTIFYQUEUE_DEV_EMBEDDED_DB": "1"}
    if env.get("DATABASE_URL"):
        yield env
        return
    was_running = embedded_db("status").returncode == 0
    start = ["start", "--benchmark"] if benchmark else ["start"]
    started = embedded_db(*start, capture_output=True, text=True)
    if started.returncode != 0:
        print(started.stderr.strip(), file=sys.stderr)
        raise SystemExit(1)
    try:
        yield {**env, "DATABASE_URL": started.stdout.strip()}
    finally:
        if not was_running:
            # Ctrl-C twice must not leave the server half-stopped.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            embedded_db("stop-if-idle", stdout=subprocess.DEVNULL)


def embedded_db(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(PYTHON), "-m", "notifyqueue.embedded_db", *args], cwd=ROOT, **kwargs)


def stop() -> int:
    """Stops the embedded PostgreSQL that an interrupted run left behind."""
    if not PYTHON.exists():
        print("Nothing to stop: no .venv here yet.")
        return 0
    result = embedded_db("stop", capture_output=True, text=True)
    print(result.stdout.strip() or "The embedded PostgreSQL is not running.")
    return result.returncode


def manage(*args: str, env: dict[str, str], **kwargs) -> subprocess.CompletedProcess:
    return run([PYTHON, ROOT / "manage.py", *args], env=env, **kwargs)


def notifyqueue(args: list[str], env: dict[str, str]) -> int:
    """`notifyqueue <command>` (Django's management commands) on the development database."""
    command = VENV / ("Scripts/notifyqueue.exe" if os.name == "nt" else "bin/notifyqueue")
    return subprocess.run([str(command), *args], cwd=ROOT, env=env).returncode


def serve(args: list[str], env: dict[str, str]) -> int:
    if args not in ([], ["--webhooks"]):
        print("usage: python3 dev.py serve [--webhooks]", file=sys.stderr)
        return 2
    host, port = os.environ.get("HOST", "127.0.0.1"), int(os.environ.get("PORT", "8000"))
    problem = port_problem(host, port)
    if problem:
        print(
            f"dev.py serve: cannot listen on {host}:{port}: {problem}.\n"
            f"Stop whatever uses it, or pick another port: PORT={port + 1} python3 dev.py serve",
            file=sys.stderr,
        )
        return 1
    started_at = time.monotonic()
    manage("migrate", "--no-input", "--verbosity", "0", env=env)
    receiver = webhook_receiver_start() if args == ["--webhooks"] else None
    webhook_url = f"http://127.0.0.1:{receiver.server_port}/webhooks" if receiver else ""
    if receiver:
        # The receiver is on loopback, which webhook URLs may not name elsewhere.
        env = {**env, "NOTIFYQUEUE_WEBHOOK_ALLOW_PRIVATE": "true"}
    key = manage(
        *("demo_key", DEMO_CLIENT, "--operator", "--key-file", str(DEMO_KEY_FILE)),
        *("--webhook-url", webhook_url),
        env=env,
        capture_output=True,
        text=True,
    ).stdout.strip()
    password = admin_user_ensure(env)
    # Worker and API processes write their counters here; the API's /metrics sums them all.
    shutil.rmtree(METRICS_DIR, ignore_errors=True)
    METRICS_DIR.mkdir(parents=True)
    env = {**env, "PROMETHEUS_MULTIPROC_DIR": str(METRICS_DIR)}
    # start_new_session: Ctrl-C reaches dev.py only, which then stops the API, the worker and
    # the database in order.
    processes = [
        subprocess.Popen(
            [
                str(PYTHON),
                "-m",
                "gunicorn",
                "-c",
                "python:notifyqueue.gunicorn_conf",
                "--bind",
                f"{host}:{port}",
                "--workers",
                str(API_WORKERS),
            ],
            cwd=ROOT,
            env=env,
            start_new_session=True,
        ),
        subprocess.Popen(
            [str(PYTHON), "manage.py", "run_worker", "--concurrency", "8"],
            cwd=ROOT,
            env=env,
            start_new_session=True,
        ),
    ]
    try:
        if not wait_until_listening(host, port, processes):
            print("dev.py serve: the API did not start (see above).", file=sys.stderr)
            return 1
        print_banner(host, port, key, password, webhook_url, time.monotonic() - started_at)
        while all(p.poll() is None for p in processes):
            time.sleep(0.5)
        print("dev.py serve: a process ended unexpectedly; stopping the rest.", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if receiver:
            receiver.shutdown()
        for p in processes:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in processes:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def port_problem(host: str, port: int) -> str | None:
    """Why host:port cannot be listened on (e.g. already in use), or None."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def wait_until_listening(host: str, port: int, processes: list[subprocess.Popen]) -> bool:
    target = "127.0.0.1" if host in {"0.0.0.0", ""} else "::1" if host == "::" else host
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in processes):
            return False
        with contextlib.suppress(OSError), socket.create_connection((target, port), timeout=1):
            return True
        time.sleep(0.2)
    return False


def admin_user_ensure(env: dict[str, str]) -> str:
    """The `operator` superuser for /admin/; its password is made once and kept in .notifyqueue."""
    if not ADMIN_PASSWORD_FILE.exists():
        STATE.mkdir(parents=True, exist_ok=True)
        ADMIN_PASSWORD_FILE.touch(mode=0o600)
        ADMIN_PASSWORD_FILE.write_text(secrets.token_urlsafe(12) + "\n")
    password = ADMIN_PASSWORD_FILE.read_text().strip()
    created = subprocess.run(
        [
            *(str(PYTHON), "manage.py", "createsuperuser", "--no-input"),
            *("--username", ADMIN_USER, "--email", f"{ADMIN_USER}@localhost"),
        ],
        cwd=ROOT,
        env={**env, "DJANGO_SUPERUSER_PASSWORD": password},
        capture_output=True,
        text=True,
    )
    if created.returncode != 0 and "already taken" not in created.stderr:
        print(created.stderr, file=sys.stderr)
        raise SystemExit(1)
    return password


def print_banner(
    host: str, port: int, key: str, password: str, webhook_url: str, startup_s: float
) -> None:
    site = f"http://{host}:{port}"
    webhooks = (
        f"printed here as they arrive (the demo client's webhook URL is {webhook_url})"
        if webhook_url
        else "python3 dev.py serve --webhooks prints them here as they arrive"
    )
    print(
        f"\nNotify Queue is running ({startup_s:.1f} s to start).\n"
        f"  API:        {site}/api/v1/notifications\n"
        f"  API docs:   {site}/api/docs/ (Swagger UI), {site}/api/redoc/ (ReDoc)\n"
        f"  Admin:      {site}/admin/  user {ADMIN_USER}  password {password}\n"
        f"  Status:     {site}/status    Metrics: {site}/metrics\n"
        f"  Demo key:   {key}  (client '{DEMO_CLIENT}', an operator; kept in {DEMO_KEY_FILE})\n"
        f"  Webhooks:   {webhooks}\n"
        f"  Queue:      python3 dev.py notifyqueue queue_status (in another terminal)\n\n"
        f"Try, in another terminal:\n"
        f"  export KEY={key}\n"
        f"  curl -s -X POST {site}/api/v1/notifications \\\n"
        f"    -H \"Authorization: Api-Key $KEY\" -H 'Idempotency-Key: hello-1' \\\n"
        f"    -H 'Content-Type: application/json' \\\n"
        f'    -d \'{{"channel": "email", "recipient": "ada@example.com", "body": "Hello"}}\'\n\n'
        f"Ctrl-C (or SIGTERM to pid {os.getpid()}) stops the API, the worker and the database.\n",
        flush=True,
    )


class WebhookPrinter(http.server.BaseHTTPRequestHandler):
    """Answers every webhook POST with 204 and prints its event on one line."""

    def do_POST(self):
        length = min(int(self.headers.get("Content-Length") or 0), WEBHOOK_PRINT_MAX_BYTES)
        body = self.rfile.read(length).decode(errors="replace")
        self.send_response(204)
        self.end_headers()
        print(f"webhook <- {body}", flush=True)

    def log_message(self, format, *args):
        pass  # the event line above is the log


def webhook_receiver_start() -> http.server.ThreadingHTTPServer:
    """A webhook receiver on a free loopback port, serving in a thread of this process."""
    receiver = http.server.ThreadingHTTPServer(("127.0.0.1", 0), WebhookPrinter)
    receiver.daemon_threads = True
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    return receiver


def ensure_test_packages() -> None:
    """Debian's chromium (the browser tests; never a browser download), faketime (the fault
    suite's skewed-clock workers), pgbouncer (tests/integration/test_pgbouncer.py) and
    PostgreSQL's server, installed with apt-get when missing, as the module docstring says;
    the tests that need one skip when it is still missing."""
    missing = [name for name, path in TEST_PACKAGES.items() if not glob.glob(path)]
    if not missing:
        return
    names = ", ".join(missing)
    if os.environ.get("NOTIFYQUEUE_DEV_NO_APT") == "1":
        print(f"NOTIFYQUEUE_DEV_NO_APT=1: not installing {names}; their tests will skip.")
        return
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("apt-get") is None:
        print(f"{names} missing and apt-get cannot run here (not root): their tests will skip.")
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "--no-upgrade"]
    if subprocess.run(["apt-get", "update", "-qq"], env=env).returncode != 0:
        print("'apt-get update' failed: their tests will skip.", file=sys.stderr)
        return
    plan = subprocess.run(
        [*install, "--simulate", *missing], env=env, capture_output=True, text=True
    )
    new, upgraded = apt_plan(plan.stdout)
    if plan.returncode != 0 or upgraded:
        why = f"it would upgrade {', '.join(upgraded)}" if upgraded else plan.stderr.strip()
        print(f"Not installing {names} ({why}): their tests will skip.", file=sys.stderr)
        return
    print(
        f"Installing {names} for the tests with apt-get: {len(new)} new Debian packages "
        f"({', '.join(new)}); no recommended packages, nothing upgraded, services left "
        "stopped and disabled (NOTIFYQUEUE_DEV_NO_APT=1 skips this).",
        flush=True,
    )
    enabled_before = systemd_units_enabled()
    with services_not_started():
        installed = subprocess.run([*install, *missing], env=env).returncode == 0
    for unit in sorted(systemd_units_enabled() - enabled_before):
        print(f"Disabling {unit}, which the install enabled.")
        subprocess.run(["systemctl", "disable", "--now", "--quiet", unit], check=False)
    if not installed:
        print(f"'apt-get install {names}' failed: their tests will skip.", file=sys.stderr)


def apt_plan(simulated: str) -> tuple[list[str], list[str]]:
    """The packages `apt-get install --simulate` would install anew, and those it would
    upgrade ("Inst name [installed version] (new version ...)")."""
    new, upgraded = [], []
    for line in simulated.splitlines():
        if line.startswith("Inst "):
            name, rest = line.split()[1], line.split(maxsplit=2)[2:]
            (upgraded if rest and rest[0].startswith("[") else new).append(name)
    return new, upgraded


def systemd_units_enabled() -> set[str]:
    if shutil.which("systemctl") is None:
        return set()
    listed = subprocess.run(
        ["systemctl", "list-unit-files", "--state=enabled", "--no-legend", "--no-pager"],
        capture_output=True,
        text=True,
    )
    return {line.split()[0] for line in listed.stdout.splitlines() if line.strip()}


@contextlib.contextmanager
def services_not_started() -> Iterator[None]:
    """Debian's packages start their services through invoke-rc.d, which asks policy-rc.d
    first; exit 101 there means "not now". An existing policy-rc.d is left as it is."""
    if POLICY_RC_D.exists():
        yield
        return
    POLICY_RC_D.write_text("#!/bin/sh\n# dev.py: no service starts while it installs.\nexit 101\n")
    POLICY_RC_D.chmod(0o755)
    try:
        yield
    finally:
        POLICY_RC_D.unlink()


def test(pytest_args: list[str], env: dict[str, str]) -> int:
    steps = [
        [PYTHON, "-m", "ruff", "check", "."],
        [PYTHON, "-m", "ruff", "format", "--check", "."],
        # The one-way order of the apps ([tool.importlinter] in pyproject.toml).
        [VENV / ("Scripts/lint-imports.exe" if os.name == "nt" else "bin/lint-imports")],
        [PYTHON, ROOT / "manage.py", "makemigrations", "--check", "--dry-run"],
        [PYTHON, "-m", "pytest", *pytest_args],
    ]
    for step in steps:
        if subprocess.run([str(s) for s in step], cwd=ROOT, env=env).returncode != 0:
            print(f"\nFAILED: {' '.join(map(str, step))}", file=sys.stderr)
            return 1
    return 0


def bench(harness_args: list[str], env: dict[str, str]) -> int:
    """bench/harness.py (docs/performance.md) in bench/.venv, which holds the peers and never
    touches the project's dependencies; wrk comes from Debian (apt-get, when run as root)."""
    bench_venv = ROOT / "bench" / ".venv"
    bench_python = bench_venv / "bin" / "python"
    requirements = ROOT / "bench" / "requirements.txt"
    stamp = bench_venv / f".installed-{hashlib.sha256(requirements.read_bytes()).hexdigest()[:16]}"
    if not stamp.exists():
        print(f"Installing the benchmark's peers into {bench_venv} ...", flush=True)
        if not bench_python.exists():
            venv.EnvBuilder(with_pip=True).create(bench_venv)
        run([bench_python, "-m", "pip", "install", "--quiet", "-r", requirements])
        stamp.touch()
    if shutil.which("wrk") is None and "--help" not in harness_args:
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            print(
                "The benchmark needs wrk: install it (e.g. 'apt-get install wrk').", file=sys.stderr
            )
            return 1
        apt_env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], env=apt_env)
        installed = subprocess.run(
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "--no-upgrade", "wrk"],
            env=apt_env,
        )
        if installed.returncode != 0:
            print("'apt-get install wrk' failed; install wrk and run again.", file=sys.stderr)
            return 1
    harness = [bench_python, ROOT / "bench" / "harness.py", "--project-python", PYTHON]
    return subprocess.run([str(c) for c in [*harness, *harness_args]], cwd=ROOT, env=env).returncode


def run(cmd: list, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=ROOT, check=True, **kwargs)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
