"""The guarded outbound transport (notifyqueue/outbound.py) that webhooks and the http provider
share: the address rules, and its behaviour against a real scripted server on 127.0.0.1."""

import time

import pytest

from notifyqueue.outbound import (
    MAX_BODY_BYTES,
    OutboundRefused,
    address_refusal,
    outbound_post,
    outbound_target_resolve,
)
from tests.support.http_servers import ScriptedHTTPServer, answer, http_answer


@pytest.fixture
def raw_server():
    servers = []

    def start(*scripts, default=None):
        servers.append(ScriptedHTTPServer(*scripts, default=default))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def post(url: str, **kwargs):
    options = {"body": b"{}", "headers": {}, "timeout_s": 1.0, "allow_private": True}
    return outbound_post(url=url, **{**options, **kwargs})


@pytest.mark.parametrize(
    "address, reason",
    [
        ("127.0.0.1", "loopback"),
        ("10.1.2.3", "private"),
        ("192.168.0.10", "private"),
        ("172.16.5.5", "private"),
        ("169.254.169.254", "link-local"),
        ("224.0.0.1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("240.0.0.1", "reserved"),
        ("100.64.0.1", "non-global"),
        ("::1", "loopback"),
        ("fe80::1", "link-local"),
        ("fd00::1", "private"),
        ("ff02::1", "multicast"),
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:10.0.0.1", "private"),
    ],
)
def test_non_public_addresses_are_refused(address, reason):
    refusal = address_refusal(address)
    assert refusal is not None and reason in refusal


@pytest.mark.parametrize("address", ["93.184.215.14", "8.8.8.8", "2606:4700:4700::1111"])
def test_public_addresses_are_allowed(address):
    assert address_refusal(address) is None


def test_resolution_refuses_a_loopback_literal_unless_private_is_allowed():
    with pytest.raises(OutboundRefused, match="loopback"):
        outbound_target_resolve("http://127.0.0.1:8080/x", allow_private=False)
    target = outbound_target_resolve("http://127.0.0.1:8080/x", allow_private=True)
    assert (target.host, target.port, target.address) == ("127.0.0.1", 8080, "127.0.0.1")


def test_resolution_refuses_a_name_that_resolves_to_loopback():
    with pytest.raises(OutboundRefused, match="localhost refused"):
        outbound_target_resolve("https://localhost/hook", allow_private=False)


@pytest.mark.parametrize(
    "url", ["ftp://example.com/x", "file:///etc/passwd", "gopher://example.com", "http:///path"]
)
def test_resolution_refuses_anything_but_http_with_a_host(url):
    with pytest.raises(OutboundRefused):
        outbound_target_resolve(url, allow_private=True)


def test_a_3xx_is_an_answer_never_followed(raw_server):
    target = raw_server(answer(200))
    server = raw_server(answer(308, "", {"Location": target.url()}))

    result = post(server.url())

    assert (result.status_code, result.failure) == (308, None)
    assert target.requests == []


def test_a_loopback_target_is_refused_before_connecting(raw_server):
    server = raw_server(answer(200))

    result = post(server.url(), allow_private=False)

    assert result.refused and result.status_code is None
    assert result.failure.startswith("address refused: host 127.0.0.1 refused")
    assert server.requests == []


def test_the_body_read_is_bounded_and_says_when_it_was_cut(raw_server):
    big = b"a" * (MAX_BODY_BYTES * 3)
    server = raw_server(answer(200, big), answer(200, big), answer(200, b"short"))

    assert post(server.url(), max_body_bytes=10**9).body == big[:MAX_BODY_BYTES]
    cut = post(server.url(), max_body_bytes=100)
    assert (cut.body, cut.body_truncated) == (big[:100], True)
    whole = post(server.url(), max_body_bytes=100)
    assert (whole.body, whole.body_truncated) == (b"short", False)


def test_a_compressed_answer_is_not_inflated(raw_server):
    # Accept-Encoding: identity is sent; a server that compresses anyway is read as raw bytes.
    server = raw_server(answer(200, b"\x1f\x8b compressed", {"Content-Encoding": "gzip"}))

    result = post(server.url())

    assert result.body == b"\x1f\x8b compressed"
    assert server.requests[0].headers["accept-encoding"] == "identity"


def test_one_total_deadline_covers_a_dripped_body(raw_server):
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"
    server = raw_server(lambda conn: conn.send(head) and conn.drip(b"x" * 100, every_s=0.1))

    started = time.monotonic()
    result = post(server.url(), timeout_s=0.5)

    assert result.failure == "timeout" and result.status_code is None
    assert time.monotonic() - started < 0.5 + 0.5


def test_dripped_headers_end_at_the_deadline_too(raw_server):
    server = raw_server(lambda conn: conn.drip(http_answer(204), every_s=0.2))

    started = time.monotonic()
    assert post(server.url(), timeout_s=0.4).failure == "timeout"
    assert time.monotonic() - started < 0.4 + 0.5
