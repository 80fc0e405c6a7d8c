#!/usr/bin/env python3
"""Sets up everything Notify Queue needs, then runs it or tests it.

    python3 dev.py serve   # API on http://127.0.0.1:8000 plus one worker, with a demo client
    python3 dev.py test    # lint, migration check and the whole test suite

Needs only Python 3.11+ and pip: it creates `.venv/`, installs the project into it, and (when
DATABASE_URL is unset) starts the embedded PostgreSQL under `.notifyqueue/`. Any further
arguments to `test` are passed to pytest. `test` also installs Debian's chromium (with
apt-get, when run as root) for the admin's browser test, which skips only if that fails.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PYTHON = VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
DEMO_CLIENT = "demo"
CHROMIUM = Path("/usr/bin/chromium")


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[1] not in {"serve", "test"}:
        print(__doc__.strip())
        return 2
    ensure_installed()
    if argv[1] == "serve":
        return serve(host=os.environ.get("HOST", "127.0.0.1"), port=os.environ.get("PORT", "8000"))
    return test(argv[2:])


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


def manage(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return run([PYTHON, str(ROOT / "manage.py"), *args], **kwargs)


def serve(*, host: str, port: str) -> int:
    manage("migrate", "--no-input", "--verbosity", "0")
    key = manage("demo_key", DEMO_CLIENT, capture_output=True, text=True).stdout.strip()
    api = f"http://{host}:{port}"
    print(
        f"\nNotify Queue is running.\n"
        f"  API:        {api}/api/v1/notifications\n"
        f"  API docs:   {api}/api/docs/\n"
        f"  Admin:      {api}/admin/ (login: .venv/bin/python manage.py createsuperuser)\n"
        f"  Status:     {api}/status\n"
        f"  Demo key:   {key}\n\n"
        f"Try:\n"
        f"  curl -s -X POST {api}/api/v1/notifications \\\n"
        f"    -H 'Authorization: Api-Key {key}' -H 'Idempotency-Key: hello-1' \\\n"
        f"    -H 'Content-Type: application/json' \\\n"
        f'    -d \'{{"channel": "email", "recipient": "ada@example.com", "body": "Hello"}}\'\n',
        flush=True,
    )
    processes = [
        subprocess.Popen(
            [PYTHON, "manage.py", "runserver", "--noreload", f"{host}:{port}"], cwd=ROOT
        ),
        subprocess.Popen([PYTHON, "manage.py", "run_worker", "--concurrency", "8"], cwd=ROOT),
    ]
    try:
        while all(p.poll() is None for p in processes):
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        for p in processes:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in processes:
            p.wait(timeout=30)
    return 0


def ensure_browser() -> None:
    """Debian's chromium for tests/test_admin_browser.py; never a browser download."""
    if CHROMIUM.exists():
        return
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("apt-get") is None:
        print(f"{CHROMIUM} is missing and apt-get cannot run here: the browser test will skip.")
        return
    print("Installing chromium with apt-get for the admin browser test ...", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"]):
        if subprocess.run(cmd, env=env).returncode != 0:
            print(f"'{' '.join(cmd)}' failed: the browser test will skip.", file=sys.stderr)
            return


def test(pytest_args: list[str]) -> int:
    ensure_browser()
    steps = [
        [PYTHON, "-m", "ruff", "check", "."],
        [PYTHON, "-m", "ruff", "format", "--check", "."],
        [PYTHON, str(ROOT / "manage.py"), "makemigrations", "--check", "--dry-run"],
        [PYTHON, "-m", "pytest", *pytest_args],
    ]
    for step in steps:
        if subprocess.run(step, cwd=ROOT).returncode != 0:
            print(f"\nFAILED: {' '.join(map(str, step))}", file=sys.stderr)
            return 1
    return 0


def run(cmd: list, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=ROOT, check=True, **kwargs)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
