"""`python3 dev.py serve` as a newcomer meets it: a busy port is an error, SIGTERM stops every
process it started, and the demo client's key is the same on every run.

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


def serve(port: int, database_url: str, state: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(ROOT / "dev.py"), "serve"],
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
def test_serve_shows_worker_metrics_and_sigterm_stops_the_api_and_the_worker(
    database_url, tmp_path
):
    port = free_port()
    process = serve(port, database_url, tmp_path)
    lines = []
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
            if "is running" in line:
                break
        children = psutil.Process(process.pid).children(recursive=True)
        assert {"gunicorn", "run_worker"} <= {
            part
            for child in children
            for part in child.cmdline()
            if part in {"gunicorn", "run_worker"}
        }
        # The worker's delivery counters show on the API's /metrics (one shared metrics folder).
        key = (tmp_path / "demo-api-key").read_text().strip()
        notification_create(port, key)
        assert metrics_wait_for(port, 'notifyqueue_notifications_finished_total{channel="email"')

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()
    _, alive = psutil.wait_procs(children, timeout=10)
    assert alive == []
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass


def notification_create(port: int, key: str) -> None:
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


def metrics_wait_for(port: int, series: str, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            if series in response.read().decode():
                return True
        time.sleep(0.2)
    return False


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
