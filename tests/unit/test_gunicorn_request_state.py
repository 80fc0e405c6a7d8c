"""When the API's worker hands a request to a thread: only once it is whole in memory
(notifyqueue/serving/gunicorn_worker.py, `request_state`)."""

from notifyqueue.serving.gunicorn_worker import (
    BODY_TOO_LARGE_ANSWER,
    BUFFERED_BODY_MAX_BYTES,
    HEAD_MAX_BYTES,
    HEAD_TOO_LARGE_ANSWER,
    request_state,
)

HEAD = b"POST /api/v1/notifications HTTP/1.1\r\nHost: api\r\n"


def test_a_head_without_its_end_is_not_whole():
    assert request_state(HEAD) is False


def test_a_request_without_a_body_is_whole_once_its_head_ends():
    assert request_state(b"GET /status HTTP/1.1\r\nHost: api\r\n\r\n") is True


def test_a_body_is_whole_when_content_length_bytes_have_arrived():
    head = HEAD + b"content-LENGTH: 5\r\n\r\n"
    assert request_state(head + b"{}") is False
    assert request_state(head + b'{"a"}') is True
    assert request_state(head + b'{"a"}GET / HTTP/1.1') is True  # pipelined behind it


def test_a_chunked_body_is_whole_at_its_last_chunk():
    head = HEAD + b"Transfer-Encoding: chunked\r\n\r\n"
    assert request_state(head + b"2\r\n{}\r\n") is False
    assert request_state(head + b"2\r\n{}\r\n0\r\n\r\n") is True


def test_a_content_length_that_is_not_a_number_goes_to_the_parser():
    assert request_state(HEAD + b"Content-Length: many\r\n\r\n") is True


def test_too_large_a_head_or_declared_body_is_refused_unread():
    assert request_state(HEAD + b"X: " + b"a" * HEAD_MAX_BYTES) == HEAD_TOO_LARGE_ANSWER
    declared = HEAD + b"Content-Length: %d\r\n\r\n" % (BUFFERED_BODY_MAX_BYTES + 1)
    assert request_state(declared) == BODY_TOO_LARGE_ANSWER
    assert BODY_TOO_LARGE_ANSWER.startswith(b"HTTP/1.1 413 ")
    assert b'"code": "payload_too_large"' in BODY_TOO_LARGE_ANSWER
