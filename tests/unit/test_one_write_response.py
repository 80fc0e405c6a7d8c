"""The API's gunicorn answers (notifyqueue/serving/gunicorn_worker.py, `OneWriteResponse`):
the headers go out in the same write as the body's first bytes, and the bytes on the wire are
the ones gunicorn's own response writes.

Each test writes to one end of a SOCK_SEQPACKET socket pair, where every write is one record
and every `recv` reads exactly one: the records read are the writes made.
"""

from __future__ import annotations

import socket
import time
import types
from collections.abc import Callable

import pytest
from gunicorn import util
from gunicorn.config import Config
from gunicorn.http import wsgi
from gunicorn.http.parser import RequestParser

from notifyqueue.serving import gunicorn_worker
from notifyqueue.serving.gunicorn_worker import ONE_WRITE_MAX_BYTES, OneWriteResponse, http_date_now

BODY = b'{"id": "0190a0b2-0000-7000-8000-000000000000", "status": "PENDING"}'
GET = b"GET /api/v1/notifications HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
HEAD = b"HEAD /api/v1/notifications HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
CLOSE = b"GET /api/v1/notifications HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
HTTP_1_0 = b"GET /api/v1/notifications HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n"
LARGE = b"x" * (ONE_WRITE_MAX_BYTES + 1)
# gunicorn's own response class (`wsgi.Response` names ours once the worker module is loaded).
GUNICORN_RESPONSE = OneWriteResponse.__base__


def writes(
    response_class: type[wsgi.Response],
    request: bytes,
    status: str,
    headers: list[tuple[str, str]],
    answer: Callable[[wsgi.Response], None],
) -> list[bytes]:
    """The writes `response_class` makes for one answer, one record each."""
    cfg = Config()
    req = next(iter(RequestParser(cfg, [request], ("127.0.0.1", 40000))))
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with ours, theirs:
        response = response_class(req, ours, cfg)
        response.start_response(status, headers)
        answer(response)
        response.close()
        theirs.setblocking(False)
        records = []
        while True:
            try:
                records.append(theirs.recv(1 << 20))
            except BlockingIOError:
                return records


def without_date(record: bytes) -> bytes:
    """The record without its Date header, which the two responses compared may differ in."""
    return b"\r\n".join(line for line in record.split(b"\r\n") if not line.startswith(b"Date:"))


def body_in_one(response: wsgi.Response) -> None:
    response.write(BODY)


def body_in_three(response: wsgi.Response) -> None:
    for part in (BODY[:10], BODY[10:20], BODY[20:]):
        response.write(part)


def nothing(response: wsgi.Response) -> None:
    pass


CASES = {
    "a known length, one write": (
        GET,
        "201 Created",
        [("Content-Length", str(len(BODY)))],
        body_in_one,
    ),
    "a known length, three writes": (
        GET,
        "200 OK",
        [("Content-Length", str(len(BODY)))],
        body_in_three,
    ),
    "chunked": (GET, "200 OK", [], body_in_three),
    "a client closing": (CLOSE, "200 OK", [("Content-Length", str(len(BODY)))], body_in_one),
    "HTTP/1.0": (HTTP_1_0, "200 OK", [("Content-Length", str(len(BODY)))], body_in_one),
    "a HEAD request": (HEAD, "200 OK", [("Content-Length", str(len(BODY)))], body_in_one),
    "no body": (GET, "204 No Content", [], nothing),
    "an empty write": (GET, "200 OK", [("Content-Length", "0")], lambda r: r.write(b"")),
    "a large body": (
        GET,
        "200 OK",
        [("Content-Length", str(len(LARGE)))],
        lambda r: r.write(LARGE),
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_the_bytes_on_the_wire_are_gunicorns(case):
    request, status, headers, answer = CASES[case]

    ours = writes(OneWriteResponse, request, status, headers, answer)
    gunicorns = writes(GUNICORN_RESPONSE, request, status, headers, answer)

    assert without_date(b"".join(ours)) == without_date(b"".join(gunicorns))


def test_the_headers_go_out_with_the_first_bytes_of_the_body():
    one = writes(OneWriteResponse, *CASES["a known length, one write"])
    three = writes(OneWriteResponse, *CASES["a known length, three writes"])
    chunked = writes(OneWriteResponse, *CASES["chunked"])

    assert len(one) == 1
    assert one[0].startswith(b"HTTP/1.1 201 Created\r\n") and one[0].endswith(b"\r\n\r\n" + BODY)
    assert len(three) == 3 and three[0].endswith(b"\r\n\r\n" + BODY[:10])
    # Three chunks and the last, empty one: the headers rode with the first.
    assert len(chunked) == 4 and chunked[0].endswith(b"\r\n\r\nA\r\n" + BODY[:10] + b"\r\n")
    assert chunked[-1] == b"0\r\n\r\n"


def test_a_large_body_is_not_copied_to_join_its_headers():
    records = writes(OneWriteResponse, *CASES["a large body"])

    assert len(records) == 2
    assert records[0].endswith(b"\r\n\r\n") and records[1] == LARGE


def test_an_answer_without_body_bytes_still_sends_its_headers_once():
    for case in ("a HEAD request", "no body", "an empty write"):
        records = writes(OneWriteResponse, *CASES[case])

        assert len(records) == 1, case
        assert records[0].endswith(b"\r\n\r\n"), case


def test_the_date_is_the_one_gunicorn_writes_for_this_second():
    before = int(time.time())
    records = writes(OneWriteResponse, *CASES["a known length, one write"])
    after = int(time.time())

    dates = [line for line in records[0].split(b"\r\n") if line.startswith(b"Date: ")]
    assert len(dates) == 1
    assert dates[0].decode() in {f"Date: {util.http_date(s)}" for s in range(before, after + 1)}


def test_the_date_moves_on_with_each_second(monkeypatch):
    now = [1_000_000_000.25]
    monkeypatch.setattr(gunicorn_worker, "time", types.SimpleNamespace(time=lambda: now[0]))

    first = http_date_now()
    now[0] = 1_000_000_000.99
    same = http_date_now()
    now[0] = 1_000_000_001.0
    following = http_date_now()

    assert first == same == util.http_date(1_000_000_000) == "Sun, 09 Sep 2001 01:46:40 GMT"
    assert following == util.http_date(1_000_000_001)


def test_gunicorn_builds_its_answers_with_it_once_the_worker_module_is_loaded():
    assert wsgi.Response is OneWriteResponse
