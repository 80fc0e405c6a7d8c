"""Slow clients cannot stall the API as production runs it (gunicorn with
notifyqueue/gunicorn_conf.py, one thread per process): 50 connections sending their headers or
their bodies a byte at a time leave /status and a create answering at once, and each slow
request is answered 408 once its deadline passes (notifyqueue/serving/gunicorn_worker.py)."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

from notifyqueue.serving.gunicorn_worker import REQUEST_READ_TIMEOUT_S
from tests.support.gunicorn_server import gunicorn_environment, gunicorn_serving

SLOW_CONNECTIONS = 50
DRIP_INTERVAL_S = 0.5
# What an answer may take while the slow clients drip: generous, for a loaded 2-core machine.
# Unprotected, /status waited as long as the slow clients liked.
ANSWER_BOUND_S = 5.0
MEASUREMENTS = 5

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def slow_connection(port: int, kind: str) -> socket.socket:
    """A connection that has begun a request it will send one byte at a time: its head
    (`head`), or, after a whole head, a 100 KB body (`body`)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    if kind == "head":
        sock.sendall(b"POST /api/v1/notifications HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    else:
        sock.sendall(
            b"POST /api/v1/notifications HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"
        )
    return sock


def drip(slow: list[tuple[str, socket.socket]], stop: threading.Event) -> None:
    while not stop.wait(DRIP_INTERVAL_S):
        for kind, sock in slow:
            sock.send(b"X" if kind == "head" else b" ")


def timed(call) -> float:
    started = time.monotonic()
    call()
    return time.monotonic() - started


def test_fifty_slow_connections_leave_status_and_creates_answering(database_url, make_client):
    _, key = make_client("steady")
    env = gunicorn_environment(DATABASE_URL=database_url)
    with gunicorn_serving(env, workers=2) as base:
        port = int(base.rsplit(":", 1)[1])
        kinds = ["head", "body"] * (SLOW_CONNECTIONS // 2)
        slow = [(kind, slow_connection(port, kind)) for kind in kinds]
        opened_at = time.monotonic()
        stop = threading.Event()
        dripper = threading.Thread(target=drip, args=(slow, stop), daemon=True)
        dripper.start()
        try:
            time.sleep(2 * DRIP_INTERVAL_S)  # every slow request has begun dripping
            status_s = [timed(lambda: status_get(base)) for _ in range(MEASUREMENTS)]
            create_s = [
                timed(lambda n=n: notification_create(base, key, f"slow-{n}"))
                for n in range(MEASUREMENTS)
            ]
            # The deadline counts from a request's start, however busily it drips.
            stop.set()
            dripper.join(5)
            answers = [timeout_answer(sock) for _, sock in slow]
            waited_s = time.monotonic() - opened_at
        finally:
            stop.set()
            for _, sock in slow:
                sock.close()

    print(
        f"\n{SLOW_CONNECTIONS} slow connections: /status {fmt(status_s)}, create "
        f"{fmt(create_s)}; slow requests answered 408 after {waited_s:.1f} s"
    )
    assert max(status_s) < ANSWER_BOUND_S, status_s
    assert max(create_s) < ANSWER_BOUND_S, create_s
    assert all(answer.startswith(b"HTTP/1.1 408 ") for answer in answers), answers
    assert REQUEST_READ_TIMEOUT_S - 1 <= waited_s < REQUEST_READ_TIMEOUT_S + 10


def fmt(seconds: list[float]) -> str:
    median = sorted(seconds)[len(seconds) // 2]
    return f"max {max(seconds) * 1000:.0f} ms (median {median * 1000:.0f} ms)"


def status_get(base: str) -> None:
    try:
        with urllib.request.urlopen(f"{base}/status", timeout=30) as response:
            assert response.status == 200
    except urllib.error.HTTPError as degraded:  # no worker runs here: an answer all the same
        assert degraded.code == 503


def notification_create(base: str, key: str, idempotency_key: str) -> None:
    request = urllib.request.Request(
        f"{base}/api/v1/notifications",
        data=json.dumps(
            {"channel": "email", "recipient": "ada@example.com", "body": "hi"}
        ).encode(),
        headers={
            "Authorization": f"Api-Key {key}",
            "Idempotency-Key": idempotency_key,
            "Content-Type": "application/json",
        },
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 201


def timeout_answer(sock: socket.socket) -> bytes:
    """What the server sends a slow request once its deadline passes (then it closes)."""
    received = b""
    while chunk := sock.recv(4096):
        received += chunk
    return received
