"""The API's gunicorn worker (notifyqueue/serving/gunicorn_worker.py), whose thread stays on a
kept-alive connection for its next request, under real gunicorn with the production config.

What staying must not change: every request on a kept-alive connection is answered, in order,
pipelined ones too; a server stops cleanly with such a connection open; and one client sending
request after request never keeps another client's request waiting for the thread.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from tests.support.gunicorn_server import gunicorn_environment, gunicorn_serving

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

STATUS = b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


def port_of(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


def answers(sock: socket.socket, count: int) -> list[tuple[int, str | None]]:
    """The status and Connection header of the next `count` answers on `sock`, read from one
    buffer (a pipelined answer may arrive in the same segment as the one before)."""
    reader = sock.makefile("rb")
    found = []
    for _ in range(count):
        status = int(reader.readline().split()[1])
        headers = {}
        while (line := reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        reader.read(int(headers["content-length"]))
        found.append((status, headers.get("connection")))
    return found


def test_a_kept_alive_connection_is_answered_in_order_and_the_server_stops_with_it_open(
    database_url,
):
    output: list[str] = []
    env = gunicorn_environment(DATABASE_URL=database_url)
    sock = None
    try:
        with gunicorn_serving(env, workers=1, threads=2, output=output) as base:
            sock = socket.create_connection(("127.0.0.1", port_of(base)), timeout=10)
            one_by_one = []
            for _ in range(20):
                sock.sendall(STATUS)
                one_by_one += answers(sock, 1)
            sock.sendall(STATUS * 3)  # pipelined: three requests in one segment
            pipelined = answers(sock, 3)
            sock.sendall(STATUS)
            last = answers(sock, 1)
            # Leaving the block stops the server (SIGTERM, then a clean exit checked) with the
            # connection still open and its thread perhaps waiting on it.
    finally:
        if sock is not None:
            sock.close()

    assert {status for status, _ in one_by_one + pipelined + last} <= {200, 503}
    assert len(one_by_one + pipelined + last) == 24
    assert all(connection != "close" for _, connection in one_by_one + pipelined + last)
    assert "Using worker: notifyqueue.serving.gunicorn_worker.LingeringThreadWorker" in output[0]


def test_a_client_sending_request_after_request_keeps_no_other_client_waiting(database_url):
    """One thread, two clients: A sends its next request as soon as it has an answer, so a
    thread that stayed on A's connection whatever the others would never leave it. B's request
    must be answered while A is still sending."""
    env = gunicorn_environment(DATABASE_URL=database_url)
    with gunicorn_serving(env, workers=1, threads=1) as base:
        port = port_of(base)
        stop = threading.Event()
        a_answered = []

        def client_a() -> None:
            with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
                deadline = time.monotonic() + 20
                while not stop.is_set() and time.monotonic() < deadline:
                    sock.sendall(STATUS)
                    a_answered.append((answers(sock, 1)[0], time.monotonic()))

        a = threading.Thread(target=client_a)
        a.start()
        while len(a_answered) < 20:
            time.sleep(0.01)
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(STATUS)
            b_answer = answers(sock, 1)[0]
            b_answered_at = time.monotonic()
            after_b = len(a_answered)
            time.sleep(0.3)  # A goes on being answered with B's connection open
            stop.set()
        a.join()

    assert b_answer[0] in (200, 503)
    assert a_answered[-1][1] > b_answered_at, "B was answered only once A had stopped"
    assert len(a_answered) > after_b
