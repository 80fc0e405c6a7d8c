#!/usr/bin/env python3
"""Sets up everything Notify Queue needs, then runs it or tests it.

    python3 dev.py serve   # API on http://127.0.0.1:8000 (HOST, PORT) plus one worker
    python3 dev.py test    # lint, import layers, migrations check, all tests (args go to pytest)
    python3 dev.py bench   # the benchmark beside procrastinate and pgqueuer (--help, --quick)
    python3 dev.py stop    # stop a left-over embedded PostgreSQL

Needs only Python 3.11+ and pip: it creates `.venv/`, installs the project into it, and (when
DATABASE_URL is unset) starts the embedded PostgreSQL under `.notifyqueue/`, passes it to
every process it starts (with the development switch NOTIFYQUEUE_DEV_EMBEDDED_DB=1), and
stops it again when it ends. `test` also installs Debian's chromium, faketime and pgbouncer (with
apt-get, when run as root) for the browser tests, the fault suite and the PgBouncer test, which
skip only if that fails.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
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
# Debian packages the tests use, by a file each installs.
TEST_PACKAGES = {
    "chromium": "/usr/bin/chromium",
    "faketime": "/usr/lib/*/faketime/libfaketimeMT.so.1",
    "pgbouncer": "/usr/sbin/pgbouncer",
}
API_WORKERS = 2
STARTUP_TIMEOUT_S = 60


class Stopped(Exception):
    """SIGTERM or SIGINT arrived: stop everything that was started."""


def main(argv: list[str]) -> int:
    command, args = (argv[1], argv[2:]) if len(argv) > 1 else ("", [])
    if command == "stop":
        return stop()
    commands = {"serve": serve, "test": test, "bench": bench}
    if command not in commands:
        print(__doc__.strip())
        return 2
    ensure_installed()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _raise_stopped)
    try:
        with development_environment(benchmark=command == "bench") as env:
            return commands[command](args, env)
    except Stopped:
        return 0


def _raise_stopped(signum, frame):
    raise Stopped


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


def serve(args: list[str], env: dict[str, str]) -> int:
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
    key = manage(
        "demo_key",
        DEMO_CLIENT,
        "--operator",
        "--key-file",
        str(DEMO_KEY_FILE),
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
                str(ROOT / "notifyqueue" / "gunicorn.conf.py"),
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
        print_banner(host, port, key, password, time.monotonic() - started_at)
        while all(p.poll() is None for p in processes):
            time.sleep(0.5)
        print("dev.py serve: a process ended unexpectedly; stopping the rest.", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
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


def print_banner(host: str, port: int, key: str, password: str, startup_s: float) -> None:
    site = f"http://{host}:{port}"
    print(
        f"\nNotify Queue is running ({startup_s:.1f} s to start).\n"
        f"  API:        {site}/api/v1/notifications\n"
        f"  API docs:   {site}/api/docs/ (Swagger UI), {site}/api/redoc/ (ReDoc)\n"
        f"  Admin:      {site}/admin/  user {ADMIN_USER}  password {password}\n"
        f"  Status:     {site}/status    Metrics: {site}/metrics\n"
        f"  Demo key:   {key}  (client '{DEMO_CLIENT}', an operator; kept in {DEMO_KEY_FILE})\n\n"
        f"Try:\n"
        f"  curl -s -X POST {site}/api/v1/notifications \\\n"
        f"    -H 'Authorization: Api-Key {key}' -H 'Idempotency-Key: hello-1' \\\n"
        f"    -H 'Content-Type: application/json' \\\n"
        f'    -d \'{{"channel": "email", "recipient": "ada@example.com", "body": "Hello"}}\'\n\n'
        f"Ctrl-C (or SIGTERM to pid {os.getpid()}) stops the API, the worker and the database.\n",
        flush=True,
    )


def ensure_test_packages() -> None:
    """Debian's chromium (the browser tests; never a browser download), faketime (the fault
    suite's skewed-clock workers) and pgbouncer (workers and API through transaction pooling,
    tests/integration/test_pgbouncer.py), installed with apt-get when missing; the tests that
    need one skip only if that fails."""
    missing = [name for name, path in TEST_PACKAGES.items() if not glob.glob(path)]
    if not missing:
        return
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("apt-get") is None:
        print(f"{', '.join(missing)} missing and apt-get cannot run here: their tests will skip.")
        return
    print(f"Installing {', '.join(missing)} with apt-get for the tests ...", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *missing]):
        if subprocess.run(cmd, env=env).returncode != 0:
            print(f"'{' '.join(cmd)}' failed: their tests will skip.", file=sys.stderr)
            return


def test(pytest_args: list[str], env: dict[str, str]) -> int:
    ensure_test_packages()
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
        installed = subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], env=apt_env)
        if installed.returncode != 0:
            print("'apt-get install wrk' failed; install wrk and run again.", file=sys.stderr)
            return 1
    harness = [bench_python, ROOT / "bench" / "harness.py", "--project-python", PYTHON]
    return subprocess.run([str(c) for c in [*harness, *harness_args]], cwd=ROOT, env=env).returncode


def run(cmd: list, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=ROOT, check=True, **kwargs)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
