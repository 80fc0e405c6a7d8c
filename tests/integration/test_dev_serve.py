"""`python3 dev.py serve` as a newcomer meets it: a busy port is an error, SIGTERM stops every
process it started (and, like Ctrl-C, makes dev.py exit non-zero), the banner's `export KEY`
line and `--webhooks` printing each webhook, and the demo client's key the same on every run.

Each serve test runs the real dev.py (gunicorn and a worker) against the test database.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from django.core.management import call_command

from clients.models import Client

ROOT = Path(__file__).resolve().parents[2]


def serve(port: int, database_url: str, state: Path, *args: str) -> subprocess.Popen:
    return dev_py("serve", *args, port=port, database_url=database_url, state=state)


def dev_py(*args: str, port: int, database_url: str, state: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(ROOT / "dev.py"), *args],
        cwd=ROOT,
        env={
            **os.environ,
            "DATABASE_URL": database_url,
            "PORT": str(port),
            "NOTIFYQUEUE_DEV_STATE_DIR": str(state),
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_busy_port_is_an_error_before_anything_claims_to_run(database_url, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        process = serve(taken.getsockname()[1], database_url, tmp_path)
        output, _ = process.communicate(timeout=120)

    assert process.returncode == 1, output
    assert "Address already in use" in output
    assert "is running" not in output


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_serve_shows_worker_metrics_and_webhooks_and_sigterm_stops_the_api_and_the_worker(
    database_url, tmp_path
):
    port = free_port()
    process = serve(port, database_url, tmp_path, "--webhooks")
    lines = []
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
            if "stops the API" in line:  # the banner's last line
                break
        assert any("is running" in line for line in lines)
        key = (tmp_path / "demo-api-key").read_text().strip()
        assert f"export KEY={key}" in [line.strip() for line in lines]
        children = psutil.Process(process.pid).children(recursive=True)
        assert {"gunicorn", "run_worker"} <= {
            part
            for child in children
            for part in child.cmdline()
            if part in {"gunicorn", "run_worker"}
        }
        # The worker's delivery counters show on the API's /metrics (one shared metrics folder).
        notification_id = notification_create(port, key)
        assert metrics_wait_for(port, 'notifyqueue_notifications_finished_total{channel="email"')
        # Its webhook, printed by serve's receiver.
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            lines.append(line)
            if line.startswith("webhook <- "):
                break
        event = json.loads(line.removeprefix("webhook <- "))
        assert (event["jobId"], event["status"]) == (notification_id, "SENT")

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()
    _, alive = psutil.wait_procs(children, timeout=10)
    assert alive == []
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass


def notification_create(port: int, key: str) -> str:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/v1/notifications",
        data=json.dumps(
            {"channel": "email", "recipient": "ada@example.com", "body": "hi"}
        ).encode(),
        headers={
            "Authorization": f"Api-Key {key}",
            "Idempotency-Key": "serve-1",
            "Content-Type": "application/json",
        },
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 201
        return json.loads(response.read())["id"]


def metrics_wait_for(port: int, series: str, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            if series in response.read().decode():
                return True
        time.sleep(0.2)
    return False


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_dev_py_exits_as_the_signal_says_never_zero(signum, database_url, tmp_path):
    process = dev_py(
        *("notifyqueue", "shell", "-c", "import time; print('ready', flush=True); time.sleep(60)"),
        port=0,
        database_url=database_url,
        state=tmp_path,
    )
    try:
        output = []
        while "ready\n" not in output:
            output.append(process.stdout.readline())
            assert output[-1], "".join(output)
        process.send_signal(signum)
        assert process.wait(timeout=30) == 128 + signum  # 130 for Ctrl-C, 143 for SIGTERM
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()


@pytest.mark.django_db
def test_the_demo_key_is_reused_across_runs_and_belongs_to_an_operator(tmp_path, capsys):
    key_file = tmp_path / "demo-api-key"

    call_command("demo_key", "demo", "--operator", "--key-file", str(key_file))
    first = capsys.readouterr().out.strip()
    call_command("demo_key", "demo", "--operator", "--key-file", str(key_file))
    second = capsys.readouterr().out.strip()

    assert first == second == key_file.read_text().strip()
    assert Client.objects.get(name="demo").is_operator
    assert Client.objects.get(name="demo").api_keys.count() == 1
    assert key_file.stat().st_mode & 0o077 == 0


@pytest.mark.django_db
def test_a_key_that_no_longer_authenticates_is_replaced(tmp_path, capsys):
    key_file = tmp_path / "demo-api-key"
    call_command("demo_key", "demo", "--key-file", str(key_file))
    first = capsys.readouterr().out.strip()
    Client.objects.get(name="demo").api_keys.update(revoked=True)

    call_command("demo_key", "demo", "--key-file", str(key_file))
    second = capsys.readouterr().out.strip()

    assert second != first
    assert key_file.read_text().strip() == second
