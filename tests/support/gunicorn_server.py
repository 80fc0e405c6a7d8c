"""The API as production runs it: real gunicorn (notifyqueue/gunicorn_conf.py) on 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gunicorn_environment(**env: str) -> dict[str, str]:
    """This process's environment without its metrics folder (gunicorn makes its own), plus
    `env`."""
    return {
        **{k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"},
        **env,
    }


@contextlib.contextmanager
def gunicorn_serving(
    env: dict[str, str], *, workers: int, threads: int = 1, output: list[str] | None = None
) -> Iterator[str]:
    """Starts gunicorn with `workers` processes of `threads` threads, waits until `/status`
    answers, yields the base URL; stops it with SIGTERM and checks it exited cleanly. What it
    printed is appended to `output`, when given."""
    port = free_port()
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "gunicorn", "-c", "python:notifyqueue.gunicorn_conf"),
            *("--bind", f"127.0.0.1:{port}", "--workers", str(workers)),
            *("--threads", str(threads)),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    # Read as it comes: a server that logs more than a pipe holds (tracebacks) would block.
    printed: list[str] = []
    reader = threading.Thread(target=lambda: printed.extend(process.stdout), daemon=True)
    reader.start()
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                reader.join(10)
                raise AssertionError("".join(printed))
            assert time.monotonic() < deadline, "gunicorn did not start"
            try:
                with urllib.request.urlopen(f"{base}/status", timeout=2):
                    break
            except urllib.error.HTTPError:
                break  # it answered (503 while degraded is an answer)
            except OSError:
                time.sleep(0.2)
        yield base
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
        reader.join(10)
        process.stdout.close()
    if output is not None:
        output.append("".join(printed))
    assert process.returncode == 0, "".join(printed)
