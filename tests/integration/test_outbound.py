"""The guarded outbound transport (notifyqueue/outbound.py) that webhooks and the http provider
share: the address rules, and its behaviour against a real scripted server on 127.0.0.1."""

import asyncio
import contextlib
import ssl
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from notifyqueue import outbound
from notifyqueue.outbound import (
    MAX_BODY_BYTES,
    OutboundRefused,
    OutboundTarget,
    address_refusal,
    outbound_post,
    outbound_post_to,
    outbound_target_resolve,
)
from tests.support.http_servers import Request, answer, http_answer


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


class KeepAliveServer:
    """An HTTP/1.1 server on 127.0.0.1 in one asyncio thread that keeps connections open and
    counts them. Its answer depends on the path:

    /ok (or anything else) 200 with a short body after `delay_s`; /big 200 with a body three
    times MAX_BODY_BYTES; /large 200 with 100 KiB; /slow answers after 1 s; /drip sends the
    headers, then its body one byte every 0.1 s; /bye answers, then closes the connection
    without saying so.
    """

    def __init__(self, delay_s: float = 0.0, tls: ssl.SSLContext | None = None):
        self.delay_s = delay_s
        self.tls = tls
        self.heads: list[str] = []
        self.accepted = 0
        self.requests = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self._handlers: set[asyncio.Task] = set()
        started = threading.Event()
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(started),))
        self._thread.start()
        assert started.wait(5)

    def url(self, path: str = "/ok") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def _main(self, started: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0, backlog=256, ssl=self.tls)
        self.port = server.sockets[0].getsockname()[1]
        started.set()
        await self._stop.wait()
        server.close()
        for task in self._handlers:
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await server.wait_closed()

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(5)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self._handlers.add(asyncio.current_task())
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                path = head.split(" ", 2)[1]
                self.heads.append(head)
                length = int(Request(head, b"").headers.get("content-length", "0"))
                await reader.readexactly(length)
                self.requests += 1
                self.in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)
                try:
                    await self._answer(path, writer)
                finally:
                    self.in_flight -= 1
                if path == "/bye":
                    return
        except (
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ConnectionError,
            asyncio.CancelledError,
        ):
            pass
        finally:
            self._handlers.discard(asyncio.current_task())
            if self._stop.is_set():
                writer.transport.abort()  # no TLS goodbye with a client that kept it idle
            else:
                writer.close()
                with contextlib.suppress(ConnectionError):
                    await writer.wait_closed()

    async def _answer(self, path: str, writer: asyncio.StreamWriter) -> None:
        bodies = {"/big": b"b" * (MAX_BODY_BYTES * 3), "/large": b"l" * 100_000, "/drip": b"d" * 50}
        body = bodies.get(path, b"{}")
        head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        await asyncio.sleep(1.0 if path == "/slow" else self.delay_s)
        if path == "/drip":
            writer.write(head)
            for byte in body:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0.1)
            return
        writer.write(head + body)
        await writer.drain()


@pytest.fixture
def keepalive_server():
    servers = []

    def start(**kwargs):
        servers.append(KeepAliveServer(**kwargs))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def test_sequential_posts_to_one_server_share_one_connection(keepalive_server):
    server = keepalive_server()

    answers = [post(server.url()) for _ in range(20)]

    assert [a.status_code for a in answers] == [200] * 20
    assert (server.requests, server.accepted) == (20, 1)


def test_a_webhook_style_post_drains_a_short_body_and_keeps_the_connection(keepalive_server):
    server = keepalive_server()

    assert [post(server.url(), max_body_bytes=0).status_code for _ in range(5)] == [200] * 5
    assert server.accepted == 1
    # A body longer than the drain bound is left unread: that connection is not reused.
    assert post(server.url("/large"), max_body_bytes=0).status_code == 200
    assert post(server.url()).status_code == 200
    assert server.accepted == 2


def test_a_webhook_style_post_keeps_an_answer_whose_short_body_drips_but_not_its_connection(
    keepalive_server,
):
    server = keepalive_server()

    started = time.monotonic()
    dripped = post(server.url("/drip"), max_body_bytes=0, timeout_s=5)

    # The status was read: the drain gives up on the body (a byte every 0.1 s) at its first
    # wait, long before the call's timeout, and the answer stands.
    assert dripped.status_code == 200 and time.monotonic() - started < 1.0
    assert post(server.url()).status_code == 200
    assert server.accepted == 2


def test_a_truncated_read_does_not_leave_its_connection_for_the_next_call(keepalive_server):
    server = keepalive_server()

    cut = post(server.url("/big"), max_body_bytes=100)
    whole = post(server.url())

    assert cut.body_truncated and (whole.status_code, whole.body) == (200, b"{}")
    assert server.accepted == 2


def test_a_reused_connection_is_watched_by_the_deadline_and_dropped_after_it(keepalive_server):
    server = keepalive_server()
    assert post(server.url()).status_code == 200

    started = time.monotonic()
    dripped = post(server.url("/drip"), timeout_s=0.4)

    assert dripped.failure == "timeout" and time.monotonic() - started < 0.4 + 0.5
    assert server.accepted == 1  # the drip came on the kept connection, and was cut off
    slow = post(server.url("/slow"), timeout_s=0.3)
    assert slow.failure == "timeout" and server.accepted == 2  # the cut one was not reused
    assert post(server.url()).status_code == 200
    assert server.accepted == 3  # nor the one that timed out


def test_a_connection_the_server_closed_while_idle_is_not_reused(keepalive_server):
    server = keepalive_server()

    assert post(server.url("/bye")).status_code == 200
    time.sleep(0.05)  # the server's FIN reaches the idle connection
    assert post(server.url()).status_code == 200
    assert server.accepted == 2


def test_a_kept_connection_does_not_bypass_the_address_rules(keepalive_server):
    server = keepalive_server()
    assert post(server.url()).status_code == 200

    refused = post(server.url(), allow_private=False)

    assert refused.refused and refused.status_code is None
    assert server.requests == 1


def test_concurrent_posts_start_no_thread_per_call(keepalive_server):
    # Long enough for all the calls to be in flight at once on a slow host too (with 0.3 s,
    # one CI run saw the first answered before the thirtieth had started).
    server = keepalive_server(delay_s=1.5)
    post(server.url(), timeout_s=5)  # starts the deadline watchdog
    before = threading.active_count()
    calls = 30
    with ThreadPoolExecutor(max_workers=calls) as pool:
        futures = [pool.submit(post, server.url(), timeout_s=5) for _ in range(calls)]
        deadline = time.monotonic() + 5
        while server.in_flight < calls and time.monotonic() < deadline:
            time.sleep(0.01)
        during = threading.active_count()
        answers = [f.result() for f in futures]

    assert server.max_in_flight == calls
    assert during <= before + calls  # the pool's threads, nothing per call
    assert [a.status_code for a in answers] == [200] * calls
    assert not [t for t in threading.enumerate() if isinstance(t, threading.Timer)]


@pytest.fixture(scope="module")
def local_ca(tmp_path_factory):
    """A CA and a certificate for `provider.test` it signed, made with the openssl CLI."""
    d = tmp_path_factory.mktemp("tls")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def run(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=Notify Queue test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    run("req", *ec, "-keyout", "leaf.key", "-out", "leaf.csr", "-subj", "/CN=provider.test")
    (d / "leaf.ext").write_text(
        "subjectAltName=DNS:provider.test\nbasicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n"
    )
    run("x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "leaf.pem", "-days", "2", "-extfile", "leaf.ext")  # fmt: skip
    return d


@pytest.fixture
def tls_server(local_ca, keepalive_server, monkeypatch):
    """A kept-alive server with the `provider.test` certificate; the outbound transport trusts
    the local CA (instead of certifi's bundle) for the test. Records the SNI names it was sent."""
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(local_ca / "leaf.pem", local_ca / "leaf.key")
    names: list[str | None] = []
    server_context.sni_callback = lambda sslobj, name, context: names.append(name)
    client_context = outbound.create_urllib3_context(cert_reqs=ssl.CERT_REQUIRED)
    client_context.load_verify_locations(cafile=local_ca / "ca.pem")
    monkeypatch.setattr(outbound, "_TLS_CONTEXT", client_context)
    server = keepalive_server(tls=server_context)
    server.sni_names = names
    return server


def tls_post(server, host: str):
    target = OutboundTarget(scheme="https", host=host, port=server.port, address="127.0.0.1")
    url = f"https://{host}:{server.port}/ok"
    return outbound_post_to(url=url, target=target, body=b"{}", headers={}, timeout_s=2)


def test_tls_goes_to_the_pinned_address_with_the_urls_name_for_sni_and_the_certificate(
    tls_server,
):
    # provider.test does not resolve: the TLS connection reaches the pinned 127.0.0.1, and the
    # certificate is checked against the URL's name.
    answers = [tls_post(tls_server, "provider.test") for _ in range(3)]

    assert [(a.status_code, a.failure) for a in answers] == [(200, None)] * 3
    assert tls_server.sni_names == ["provider.test"]  # one handshake, then kept alive
    assert tls_server.accepted == 1
    assert f"Host: provider.test:{tls_server.port}" in tls_server.heads[0]


def test_tls_refuses_a_certificate_for_another_name(tls_server):
    answer = tls_post(tls_server, "other.test")

    assert (answer.status_code, answer.failure) == (None, "tls error")
    assert tls_server.requests == 0
