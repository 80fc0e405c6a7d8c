"""Production from an installed wheel, as docs/deploying.md does it, in a folder outside the
checkout: build the wheel, install it into a new virtualenv, then with only the production
settings (no development switch) migrate, collectstatic, create the first operator and a
client, run the API (`gunicorn -c python:notifyqueue.gunicorn_conf`, behind a pretend TLS
proxy that sets X-Forwarded-Proto) and a worker against the test database, and see the admin's
CSS, the API docs and a notification SENT. The systemd units in deploy/systemd/ are checked
against that virtualenv with `systemd-analyze verify`, where the tool exists."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.gunicorn_server import free_port

ROOT = Path(__file__).resolve().parents[2]
# The package's own files, what setuptools reads to build it, and nothing it would write into
# the checkout (build/, *.egg-info).
SOURCE_IGNORED = shutil.ignore_patterns(
    ".*", "bench", "tests", "docs", "deploy", "build", "*.egg-info", "__pycache__"
)
# Installing every dependency (from pip's cache when it has them) takes most of the time.
INSTALL_TIMEOUT_S = 600
STEP_TIMEOUT_S = 120
FORWARDED_HTTPS = {"X-Forwarded-Proto": "https"}

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(scope="module")
def installed() -> Iterator[Path]:
    """A virtualenv, outside the checkout, with the project installed from its wheel."""
    place = Path(tempfile.mkdtemp(prefix="nq-wheel-"))
    try:
        source = place / "source"
        shutil.copytree(ROOT, source, ignore=SOURCE_IGNORED)
        run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", place, source])
        (wheel,) = place.glob("notifyqueue-*.whl")
        shutil.rmtree(source)
        venv = place / "venv"
        run([sys.executable, "-m", "venv", venv])
        run([venv / "bin" / "python", "-m", "pip", "install", "--quiet", wheel])
        yield venv
    finally:
        shutil.rmtree(place, ignore_errors=True)


def run(command: list, *, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    done = subprocess.run(
        [str(part) for part in command],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
    )
    assert done.returncode == 0, f"{command}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def production_environment(venv: Path, database_url: str) -> dict[str, str]:
    """The settings docs/deploying.md sets, and nothing of this test process's own (no
    development switch, no checkout on the import path)."""
    return {
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
        "HOME": str(venv.parent),
        "DATABASE_URL": database_url,
        "DJANGO_SECRET_KEY": "a-production-secret-key-for-this-test-only-0123456789",
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1",
        "DJANGO_TRUST_X_FORWARDED_PROTO": "true",
        "NOTIFYQUEUE_POLL_INTERVAL_SECONDS": "0.2",
    }


def test_the_installed_wheel_serves_the_api_admin_and_a_worker(installed, database_url):
    venv, folder = installed, installed.parent
    env = production_environment(venv, database_url)
    notifyqueue = venv / "bin" / "notifyqueue"

    package = run(
        [venv / "bin" / "python", "-c", "import notifyqueue; print(notifyqueue.__file__)"],
        env=env,
        cwd=folder,
    )
    assert package.startswith(str(venv)), package  # the wheel's copy, not the checkout's
    run([notifyqueue, "migrate", "--no-input"], env=env, cwd=folder)
    run([notifyqueue, "collectstatic", "--no-input"], env=env, cwd=folder)
    assert (venv / "var" / "notifyqueue" / "static" / "admin" / "css" / "base.css").exists()
    run(
        [notifyqueue, "createsuperuser", "--no-input", "--username", "ops", "--email", "o@x.io"],
        env={**env, "DJANGO_SUPERUSER_PASSWORD": "a long operator password"},
        cwd=folder,
    )
    key = json.loads(run([notifyqueue, "create_client", "shop"], env=env, cwd=folder))["api_key"]

    port = free_port()
    # From another folder than collectstatic's: the same static folder all the same.
    api = start(
        [
            *(venv / "bin" / "gunicorn", "-c", "python:notifyqueue.gunicorn_conf"),
            *("--bind", f"127.0.0.1:{port}", "--workers", "2"),
        ],
        env=env,
        cwd=venv,
    )
    worker = start([notifyqueue, "run_worker", "--concurrency", "2"], env=env, cwd=folder)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_answering(f"{base}/status", api)
        login = get(f"{base}/admin/login/")
        assert b"/static/admin/css/base.css" in login
        assert get(f"{base}/static/admin/css/base.css", want_type="text/css")
        assert b"swagger-ui" in get(f"{base}/api/docs/")
        notification_id = create(base, key)
        assert wait_for_status(base, key, notification_id) == "SENT"
    finally:
        for process in (api, worker):
            process.send_signal(signal.SIGTERM)
        outputs = [process.communicate(timeout=STEP_TIMEOUT_S)[0] for process in (api, worker)]
    assert (api.returncode, worker.returncode) == (0, 0), outputs


def test_a_bare_gunicorn_serves_the_api_and_says_what_it_lacks(installed, database_url):
    """The contract's `gunicorn notifyqueue.wsgi`, with none of the project's settings."""
    env = production_environment(installed, database_url)
    port = free_port()
    api = start(
        [installed / "bin" / "gunicorn", "notifyqueue.wsgi", "--bind", f"127.0.0.1:{port}"],
        env=env,
        cwd=installed.parent,
    )
    try:
        wait_until_answering(f"http://127.0.0.1:{port}/status", api)
    finally:
        api.send_signal(signal.SIGTERM)
        output = api.communicate(timeout=STEP_TIMEOUT_S)[0]
    assert api.returncode == 0, output
    assert "gunicorn runs without notifyqueue's settings" in output
    assert "python:notifyqueue.gunicorn_conf" in output


def test_the_systemd_units_verify_against_the_installed_virtualenv(installed, tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed here")
    for unit in (ROOT / "deploy" / "systemd").glob("*.service"):
        text = unit.read_text().replace("/opt/notifyqueue/venv", str(installed))
        (tmp_path / unit.name.replace("@", "@1")).write_text(text)
    verified = subprocess.run(
        [analyze, "verify", *sorted(str(p) for p in tmp_path.glob("*.service"))],
        capture_output=True,
        text=True,
        timeout=STEP_TIMEOUT_S,
    )
    # Unknown to this host, known to a server: the notifyqueue account, /etc/notifyqueue/env.
    problems = [line for line in verified.stderr.splitlines() if "notifyqueue-" in line]
    assert verified.returncode == 0 and problems == [], verified.stderr


def start(command: list, *, env: dict[str, str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [str(part) for part in command],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def request(url: str, **kwargs) -> urllib.request.Request:
    return urllib.request.Request(
        url, headers={**FORWARDED_HTTPS, **kwargs.pop("headers", {})}, **kwargs
    )


def get(url: str, *, want_type: str = "text/html") -> bytes:
    with urllib.request.urlopen(request(url), timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith(want_type)
        return response.read()


def wait_until_answering(url: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + STEP_TIMEOUT_S
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stdout.read()
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return  # 503 while no worker has reported: an answer
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{url} did not answer")


def create(base: str, key: str) -> str:
    body = {"channel": "email", "recipient": "ada@example.com", "body": "from the wheel"}
    created = request(
        f"{base}/api/v1/notifications",
        data=json.dumps(body).encode(),
        headers={
            "Authorization": f"Api-Key {key}",
            "Idempotency-Key": "wheel-1",
            "Content-Type": "application/json",
        },
        method="POST",
    )
    with urllib.request.urlopen(created, timeout=10) as response:
        assert response.status == 201
        return json.loads(response.read())["id"]


def wait_for_status(base: str, key: str, notification_id: str) -> str:
    status, deadline = "", time.monotonic() + 60
    while time.monotonic() < deadline:
        read = request(
            f"{base}/api/v1/notifications/{notification_id}",
            headers={"Authorization": f"Api-Key {key}"},
        )
        with urllib.request.urlopen(read, timeout=10) as response:
            status = json.loads(response.read())["status"]
        if status == "SENT":
            break
        time.sleep(0.2)
    return status
