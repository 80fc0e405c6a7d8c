"""The one guarded way Notify Queue makes an outbound HTTP request (webhooks and the `http`
provider both use it).

A webhook URL is chosen by a client, and a provider URL by an operator, so without these rules
the worker could be made to call services only it can reach (cloud metadata at
169.254.169.254, an admin port on localhost, databases on the private network). The rules:

- http and https only; the host is resolved and every address it resolves to is checked:
  loopback, private, link-local, multicast, reserved, unspecified and other non-global
  addresses are refused unless `allow_private` (NOTIFYQUEUE_WEBHOOK_ALLOW_PRIVATE);
- the connection goes to the checked address and nowhere else (no second lookup, so a name
  that resolves differently a moment later, DNS rebinding, gains nothing); the Host header,
  SNI and certificate verification still use the URL's host name;
- redirects are never followed (a 3xx is an answer, handed back to the caller), and proxy
  settings, .netrc and other environment variables are ignored;
- one total deadline per call: connect, send, headers and body all end within `timeout_s`
  (plus scheduling slack), however slowly the other side drips its answer;
- at most `max_body_bytes` of the answer's body are read; the rest is never buffered.

Invariants: no database access here; nothing raises for the other side's behaviour (every
outcome is an `OutboundAnswer`); `failure` texts are short classes written here ("timeout",
"connection refused", ...), never text the other side sent.
"""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter
from urllib3 import PoolManager
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.exceptions import ConnectTimeoutError, HTTPError, NewConnectionError
from urllib3.util import connection as urllib3_connection

ALLOWED_SCHEMES = frozenset({"http", "https"})
DEFAULT_PORTS = {"http": 80, "https": 443}
# The most of an answer's body any caller reads; the rest is left unread.
MAX_BODY_BYTES = 64 * 1024
_READ_CHUNK_BYTES = 16 * 1024


class OutboundRefused(Exception):
    """The URL may never be called: retrying cannot help."""


class OutboundUnresolved(Exception):
    """DNS gave no answer this time; a later attempt may succeed."""


@dataclass(frozen=True)
class OutboundTarget:
    scheme: str
    host: str
    port: int
    address: str
    """The checked IP address; the connection goes here and nowhere else."""


@dataclass(frozen=True)
class OutboundAnswer:
    """What came of one request. Either `status_code` is set (a complete status line and
    headers arrived) or `failure` says, in a few words, why not."""

    status_code: int | None
    body: bytes
    """At most `max_body_bytes` of the body (empty when not asked for)."""
    body_truncated: bool
    failure: str | None
    """A short class: "timeout", "connection refused", "connection reset", "dns failure",
    "address refused: ..." (our own reason), ...; None when an answer arrived."""
    refused: bool
    """The address rules refuse the URL: retrying cannot help."""
    duration_s: float


def address_refusal(address: str) -> str | None:
    """Why `address` may not be called without NOTIFYQUEUE_WEBHOOK_ALLOW_PRIVATE, or None."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        # ::ffff:127.0.0.1 reaches 127.0.0.1; judge the IPv4 address it carries.
        ip = ip.ipv4_mapped
    for label, hit in (
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("unspecified", ip.is_unspecified),
        ("reserved", ip.is_reserved),
        ("private", ip.is_private),
        # Shared address space (100.64.0.0/10) and the like: not private, not public either.
        ("non-global", not ip.is_global),
    ):
        if hit:
            return f"{ip} is a {label} address"
    return None


def url_split(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of an http(s) URL; OutboundRefused for anything else."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ALLOWED_SCHEMES:
        raise OutboundRefused(f"URL must be http or https, not {scheme or 'none'!r}")
    host = parts.hostname
    if not host:
        raise OutboundRefused("URL has no host")
    try:
        port = parts.port or DEFAULT_PORTS[scheme]
    except ValueError as exc:
        raise OutboundRefused(f"URL has an invalid port: {exc}") from exc
    return scheme, host, port


def host_literal_refusal(host: str) -> str | None:
    """The first, cheap check on a URL's text: `localhost` or a refused IP literal."""
    if host == "localhost" or host.endswith(".localhost"):
        return f"{host} is a loopback name"
    try:
        return address_refusal(host)
    except ValueError:
        return None  # a name, not an address: judged after resolution


def outbound_target_resolve(url: str, *, allow_private: bool) -> OutboundTarget:
    """Resolves the URL's host and checks every address it resolves to.

    Refuses the URL when any address is refused (unless `allow_private`): a name that mixes
    public and private answers is refused rather than gambled on.
    """
    scheme, host, port = url_split(url)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise OutboundUnresolved(f"cannot resolve {host}: {exc}") from exc
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses:
        raise OutboundUnresolved(f"{host} resolved to no address")
    if not allow_private:
        for address in addresses:
            refusal = address_refusal(address)
            if refusal:
                raise OutboundRefused(
                    f"host {host} refused: {refusal} "
                    "(set NOTIFYQUEUE_WEBHOOK_ALLOW_PRIVATE to allow)"
                )
    return OutboundTarget(scheme=scheme, host=host, port=port, address=addresses[0])


class SocketDeadline:
    """Shuts down every socket it watches once `seconds` have passed since `__enter__`.

    Socket timeouts apply to each read, so a server sending one byte every few seconds would
    never trip them; shutting the socket down wakes the blocked read at once, and the caller
    checks `expired` to tell a deadline from a broken connection. `watch` takes a callable
    returning the live socket, because TLS replaces the socket a connection started with.
    """

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.expired = False
        self._sockets: list[Callable[[], socket.socket | None]] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> SocketDeadline:
        self._timer.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._timer.cancel()

    def watch(self, live_socket: Callable[[], socket.socket | None]) -> None:
        with self._lock:
            self._sockets.append(live_socket)
            expired = self.expired
        if expired:
            self._shutdown(live_socket)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            sockets = list(self._sockets)
        for live_socket in sockets:
            self._shutdown(live_socket)

    @staticmethod
    def _shutdown(live_socket: Callable[[], socket.socket | None]) -> None:
        sock = live_socket()
        if sock is not None and sock.fileno() != -1:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class _Pin:
    """Where the request's connections go: the checked address, under the deadline's watch."""

    def __init__(self, address: str, deadline: SocketDeadline):
        self.address = address
        self.deadline = deadline

    def connect(self, conn: HTTPConnection) -> socket.socket:
        try:
            sock = urllib3_connection.create_connection(
                (self.address, conn.port),
                conn.timeout,
                source_address=conn.source_address,
                socket_options=conn.socket_options,
            )
        except TimeoutError as exc:
            raise ConnectTimeoutError(
                conn, f"Connection to {conn.host} ({self.address}) timed out"
            ) from exc
        except OSError as exc:
            raise NewConnectionError(
                conn, f"Failed to connect to {conn.host} ({self.address}): {exc}"
            ) from exc
        # After TLS wraps it, `sock` is detached and conn.sock is the live socket.
        self.deadline.watch(lambda: conn.sock or sock)
        return sock


class _PinnedHTTPConnection(HTTPConnection):
    def __init__(self, *args, pin: _Pin, **kwargs):
        super().__init__(*args, **kwargs)
        self._pin = pin

    def _new_conn(self) -> socket.socket:
        return self._pin.connect(self)


class _PinnedHTTPSConnection(HTTPSConnection):
    # The host name stays the connection's `host`, so SNI and certificate verification use
    # the name from the URL while the TCP connection goes to the checked address.
    def __init__(self, *args, pin: _Pin, **kwargs):
        super().__init__(*args, **kwargs)
        self._pin = pin

    def _new_conn(self) -> socket.socket:
        return self._pin.connect(self)


class _PinnedPoolManager(PoolManager):
    def __init__(self, *args, pin: _Pin, **kwargs):
        super().__init__(*args, **kwargs)
        self._pin = pin

    def _new_pool(self, scheme, host, port, request_context=None):
        pool = super()._new_pool(scheme, host, port, request_context)
        pool.ConnectionCls = _PinnedHTTPSConnection if scheme == "https" else _PinnedHTTPConnection
        pool.conn_kw["pin"] = self._pin
        return pool


class _PinnedAdapter(HTTPAdapter):
    def __init__(self, pin: _Pin):
        self._pin = pin
        super().__init__(pool_connections=1, pool_maxsize=1, max_retries=0)

    def init_poolmanager(self, connections, maxsize, block=False, **pool_kwargs):
        self._pool_connections = connections
        self._pool_maxsize = maxsize
        self._pool_block = block
        self.poolmanager = _PinnedPoolManager(
            num_pools=connections, maxsize=maxsize, block=block, pin=self._pin, **pool_kwargs
        )


def _causes(exc: BaseException):
    """`exc` and everything it wraps (requests and urllib3 nest the socket error deeply)."""
    seen: set[int] = set()
    pending = [exc]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        pending.extend(
            e
            for e in (current.__cause__, current.__context__, *current.args)
            if isinstance(e, BaseException)
        )
        reason = getattr(current, "reason", None)
        if isinstance(reason, BaseException):
            pending.append(reason)


def failure_class(exc: BaseException) -> str:
    """A short name for why no answer arrived; never the other side's text."""
    causes = list(_causes(exc))
    for kind, label in (
        (ConnectionRefusedError, "connection refused"),
        # Before ConnectionResetError, which it subclasses.
        (http.client.RemoteDisconnected, "connection closed without an answer"),
        (ConnectionResetError, "connection reset"),
        (BrokenPipeError, "connection reset"),
        (ssl.SSLError, "tls error"),
        (requests.Timeout, "timeout"),
        (TimeoutError, "timeout"),
        (http.client.LineTooLong, "invalid answer"),
        (http.client.HTTPException, "invalid answer"),
    ):
        if any(isinstance(cause, kind) for cause in causes):
            return label
    return "connection error"


def _read_bounded(response: requests.Response, limit: int) -> tuple[bytes, bool]:
    """Up to `limit` bytes of the body as sent (no decompression), and whether more was left."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = response.raw.read(min(_READ_CHUNK_BYTES, limit + 1 - size), decode_content=False)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    data = b"".join(chunks)
    return data[:limit], len(data) > limit


def _answer(
    started: float,
    *,
    status_code: int | None = None,
    body: bytes = b"",
    truncated: bool = False,
    failure: str | None = None,
    refused: bool = False,
) -> OutboundAnswer:
    return OutboundAnswer(
        status_code=status_code,
        body=body,
        body_truncated=truncated,
        failure=failure,
        refused=refused,
        duration_s=time.monotonic() - started,
    )


def outbound_post_to(
    *,
    url: str,
    target: OutboundTarget,
    body: bytes,
    headers: dict[str, str],
    timeout_s: float,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> OutboundAnswer:
    """POSTs `body` to `url`, connecting only to `target.address`, within `timeout_s` in all.

    Reads at most `max_body_bytes` (capped at MAX_BODY_BYTES) of the answer's body; pass 0 to
    read none. A 3xx is returned like any other answer, never followed.
    """
    started = time.monotonic()
    limit = max(0, min(max_body_bytes, MAX_BODY_BYTES))
    with SocketDeadline(timeout_s) as deadline, requests.Session() as session:
        session.trust_env = False  # no proxies, .netrc or CA bundles from the environment
        adapter = _PinnedAdapter(_Pin(target.address, deadline))
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        try:
            response = session.post(
                url,
                data=body,
                # identity: the bounded read counts the bytes that arrive, and a small
                # compressed answer cannot expand into a large one.
                headers={"Accept-Encoding": "identity", **headers},
                timeout=(timeout_s, timeout_s),
                allow_redirects=False,
                stream=True,
            )
            with response:
                status = response.status_code
                data, truncated = _read_bounded(response, limit) if limit else (b"", False)
        # Reading the raw body raises urllib3's errors, not requests'.
        except (requests.RequestException, HTTPError, http.client.HTTPException, OSError) as exc:
            failure = "timeout" if deadline.expired else failure_class(exc)
            return _answer(started, failure=failure)
        if deadline.expired:
            # A socket shut down mid-answer can still parse as a complete answer; it is not one.
            return _answer(started, failure="timeout")
    return _answer(started, status_code=status, body=data, truncated=truncated)


def outbound_post(
    *,
    url: str,
    body: bytes,
    headers: dict[str, str],
    timeout_s: float,
    allow_private: bool,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> OutboundAnswer:
    """Checks `url` against the address rules after resolving it, then POSTs to that address."""
    started = time.monotonic()
    try:
        target = outbound_target_resolve(url, allow_private=allow_private)
    except OutboundRefused as exc:
        return _answer(started, failure=f"address refused: {exc}", refused=True)
    except OutboundUnresolved:
        return _answer(started, failure="dns failure")
    # The lookup counts against the one deadline (it cannot be interrupted once started).
    remaining_s = max(timeout_s - (time.monotonic() - started), 0.001)
    answer = outbound_post_to(
        url=url,
        target=target,
        body=body,
        headers=headers,
        timeout_s=remaining_s,
        max_body_bytes=max_body_bytes,
    )
    return replace(answer, duration_s=time.monotonic() - started)
