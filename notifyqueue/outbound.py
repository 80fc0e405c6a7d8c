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
- at most `max_body_bytes` of the answer's body are read; the rest is never buffered (a caller
  that reads none, webhooks, has a short body of known length, up to 16 KiB, read and dropped
  within 50 ms so the connection can be kept; never returned, never stored).

Cost: one watchdog thread for the whole process enforces every deadline (no thread per call),
and connections are kept alive per pinned target (scheme, host, port, checked address), so a
send thread calling the same provider reuses its connection. A connection is kept only when its
answer was read to the end with no error, no deadline expiry and no "close" from the server;
the address rules still run on every call's own lookup before any kept connection is taken,
and a kept connection serves only the address that lookup checked. At most
MAX_IDLE_CONNECTIONS are kept in all, none idle longer than MAX_IDLE_SECONDS.

Invariants: no database access here; nothing raises for the other side's behaviour (every
outcome is an `OutboundAnswer`); `failure` texts are short classes written here ("timeout",
"connection refused", ...), never text the other side sent.
"""

from __future__ import annotations

import contextlib
import heapq
import http.client
import ipaddress
import itertools
import os
import socket
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from urllib.parse import unquote, urlsplit

import certifi
import requests
from requests.utils import requote_uri
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.exceptions import ConnectTimeoutError, HTTPError, NewConnectionError
from urllib3.exceptions import TimeoutError as Urllib3TimeoutError
from urllib3.response import HTTPResponse
from urllib3.util import connection as urllib3_connection
from urllib3.util import make_headers
from urllib3.util.ssl_ import create_urllib3_context

ALLOWED_SCHEMES = frozenset({"http", "https"})
DEFAULT_PORTS = {"http": 80, "https": 443}
# The most of an answer's body any caller reads; the rest is left unread.
MAX_BODY_BYTES = 64 * 1024
_READ_CHUNK_BYTES = 16 * 1024
# A caller that reads no body (webhooks) still has a short one read and dropped, up to this
# size, so that the connection can be kept alive; a longer body costs the connection instead.
_DRAIN_MAX_BYTES = 16 * 1024
_DRAIN_MAX_SECONDS = 0.05


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


def _literal_addresses(host: str) -> list[str] | None:
    """A host written as an IP address in its usual form is its own and only address: no
    lookup (the resolver would answer the same). Any other spelling (a name, `127.1`, a
    scoped IPv6 address) goes to the resolver."""
    if "%" in host:
        return None
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        return None


def outbound_target_resolve(url: str, *, allow_private: bool) -> OutboundTarget:
    """Resolves the URL's host and checks every address it resolves to.

    Refuses the URL when any address is refused (unless `allow_private`): a name that mixes
    public and private answers is refused rather than gambled on.
    """
    scheme, host, port = url_split(url)
    addresses = _literal_addresses(host)
    if addresses is None:
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


class _Watchdog:
    """The process's one deadline thread: shuts down the sockets of each SocketDeadline that
    expires, in deadline order, from a heap of (deadline, entry) under one Condition.

    Started on first use (and again in a forked child, which inherits no threads). A cancelled
    deadline stays in the heap until it reaches the top or the heap is compacted, so cancelling
    costs no search; compaction keeps the heap within a small multiple of the live deadlines.
    """

    _COMPACT_AFTER = 256

    def __init__(self) -> None:
        self._condition = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, SocketDeadline]] = []
        self._sequence = itertools.count()
        self._cancelled = 0
        self._thread: threading.Thread | None = None

    def add(self, deadline: SocketDeadline) -> None:
        with self._condition:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="outbound-deadlines", daemon=True
                )
                self._thread.start()
            heapq.heappush(self._heap, (deadline.at, next(self._sequence), deadline))
            if self._heap[0][2] is deadline:
                self._condition.notify()

    def cancelled(self) -> None:
        with self._condition:
            self._cancelled += 1
            if self._cancelled > self._COMPACT_AFTER and self._cancelled * 2 > len(self._heap):
                self._heap = [entry for entry in self._heap if not entry[2].done]
                heapq.heapify(self._heap)
                self._cancelled = 0

    def _next_expired(self) -> SocketDeadline:
        with self._condition:
            while True:
                while self._heap and self._heap[0][2].done:
                    heapq.heappop(self._heap)
                    self._cancelled = max(self._cancelled - 1, 0)
                if not self._heap:
                    self._condition.wait()
                    continue
                wait_s = self._heap[0][0] - time.monotonic()
                if wait_s <= 0:
                    return heapq.heappop(self._heap)[2]
                self._condition.wait(wait_s)

    def _run(self) -> None:
        while True:
            # Outside the Condition: shutting sockets down never blocks registration.
            self._next_expired().expire()


_WATCHDOG = _Watchdog()


def _watchdog_after_fork() -> None:
    global _WATCHDOG
    _WATCHDOG = _Watchdog()


class SocketDeadline:
    """Shuts down every socket it watches once `seconds` have passed since `__enter__`.

    Socket timeouts apply to each read, so a server sending one byte every few seconds would
    never trip them; shutting the socket down wakes the blocked read at once, and the caller
    checks `expired` to tell a deadline from a broken connection. `watch` takes a callable
    returning the live socket, because TLS replaces the socket a connection started with.

    One watchdog thread serves every deadline of the process (no thread per call). After
    `__exit__` the deadline never fires: if `expired` is still False then, no socket it watched
    will be touched again, so a connection may be reused.
    """

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.expired = False
        self.done = False
        self.at = 0.0
        self._sockets: list[Callable[[], socket.socket | None]] = []
        self._lock = threading.Lock()

    def __enter__(self) -> SocketDeadline:
        self.at = time.monotonic() + self.seconds
        _WATCHDOG.add(self)
        return self

    def __exit__(self, *exc_info) -> None:
        with self._lock:
            self.done = True
            expired = self.expired
        if not expired:
            _WATCHDOG.cancelled()

    def watch(self, live_socket: Callable[[], socket.socket | None]) -> None:
        with self._lock:
            self._sockets.append(live_socket)
            expired = self.expired
        if expired:
            self._shutdown(live_socket)

    def expire(self) -> None:
        with self._lock:
            if self.done:
                return
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


def _tls_context() -> ssl.SSLContext:
    """One verifying context for the process (certifi's CA bundle, as `requests` used): loading
    the bundle per connection costs milliseconds. The environment's CA variables are ignored."""
    global _TLS_CONTEXT
    if _TLS_CONTEXT is None:
        context = create_urllib3_context(cert_reqs=ssl.CERT_REQUIRED)
        context.load_verify_locations(cafile=certifi.where())
        _TLS_CONTEXT = context
    return _TLS_CONTEXT


_TLS_CONTEXT: ssl.SSLContext | None = None


class _PinnedConnection:
    """Connects to the checked address and nowhere else; the new socket is watched by the
    deadline of the call that opens it."""

    address: str
    deadline: SocketDeadline

    def _new_conn(self) -> socket.socket:
        try:
            sock = urllib3_connection.create_connection(
                (self.address, self.port),
                self.timeout,
                source_address=self.source_address,
                socket_options=self.socket_options,
            )
        except TimeoutError as exc:
            raise ConnectTimeoutError(
                self, f"Connection to {self.host} ({self.address}) timed out"
            ) from exc
        except OSError as exc:
            raise NewConnectionError(
                self, f"Failed to connect to {self.host} ({self.address}): {exc}"
            ) from exc
        # After TLS wraps it, `sock` is detached and self.sock is the live socket.
        self.deadline.watch(lambda: self.sock or sock)
        return sock


class _PinnedHTTPConnection(_PinnedConnection, HTTPConnection):
    pass


class _PinnedHTTPSConnection(_PinnedConnection, HTTPSConnection):
    # The host name stays the connection's `host`, so SNI and certificate verification use
    # the name from the URL while the TCP connection goes to the checked address.
    pass


def _new_connection(target: OutboundTarget, timeout_s: float) -> HTTPConnection:
    if target.scheme == "https":
        conn: HTTPConnection = _PinnedHTTPSConnection(
            target.host,
            target.port,
            timeout=timeout_s,
            cert_reqs="CERT_REQUIRED",
            ssl_context=_tls_context(),
        )
    else:
        conn = _PinnedHTTPConnection(target.host, target.port, timeout=timeout_s)
    conn.address = target.address
    return conn


class _IdleConnections:
    """Kept-alive connections, keyed by the pinned target (scheme, host, port, address).

    A connection is given back only in a known state (its answer read to the end, no error, no
    deadline expiry, the server not closing it) and taken again only to the same pinned
    address. At most `max_idle` are kept in all (the longest idle is closed first), none longer
    than `max_idle_s`, and a connection the server has closed meanwhile is not reused.
    """

    def __init__(self, *, max_idle: int, max_idle_s: float) -> None:
        self.max_idle = max_idle
        self.max_idle_s = max_idle_s
        self._lock = threading.Lock()
        self._by_target: dict[OutboundTarget, OrderedDict[int, HTTPConnection]] = {}
        # Every idle connection, longest idle first: (target, when it was given back).
        self._order: OrderedDict[int, tuple[OutboundTarget, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._order)

    def take(self, target: OutboundTarget) -> HTTPConnection | None:
        """The most recently used live idle connection to `target`, or None."""
        while True:
            closing: list[HTTPConnection] = []
            with self._lock:
                idle = self._by_target.get(target)
                if not idle:
                    return None
                key, conn = idle.popitem(last=True)
                _, since = self._order.pop(key)
                if time.monotonic() - since > self.max_idle_s:
                    # The most recent is stale, so are the older ones.
                    closing = [conn, *idle.values()]
                    for older in idle:
                        del self._order[older]
                    idle.clear()
                if not idle:
                    del self._by_target[target]
            if closing:
                _close_all(closing)
                return None
            # Readable while idle means the server closed it (or sent something unasked).
            if conn.is_connected:
                return conn
            conn.close()

    def give(self, target: OutboundTarget, conn: HTTPConnection) -> None:
        closing: list[HTTPConnection] = []
        now = time.monotonic()
        with self._lock:
            key = id(conn)
            self._by_target.setdefault(target, OrderedDict())[key] = conn
            self._order[key] = (target, now)
            while self._order:
                oldest, (oldest_target, since) = next(iter(self._order.items()))
                if len(self._order) <= self.max_idle and now - since <= self.max_idle_s:
                    break
                del self._order[oldest]
                idle = self._by_target[oldest_target]
                closing.append(idle.pop(oldest))
                if not idle:
                    del self._by_target[oldest_target]
        _close_all(closing)

    def clear(self) -> None:
        with self._lock:
            closing = [conn for idle in self._by_target.values() for conn in idle.values()]
            self._by_target.clear()
            self._order.clear()
        _close_all(closing)


def _close_all(conns: list[HTTPConnection]) -> None:
    for conn in conns:
        with contextlib.suppress(OSError):
            conn.close()


# Enough for the worker's send threads and the webhook slots to keep one connection each to a
# provider; past it, the longest idle is closed. 1 s idle at most: shorter than the keep-alive
# timeout of common servers (2 s gunicorn, 5 s uvicorn/node), so a server closing an idle
# connection as it is reused is rare (a POST on such a connection fails "connection closed
# without an answer", a temporary failure, and is not resent here).
MAX_IDLE_CONNECTIONS = 256
MAX_IDLE_SECONDS = 1.0
_IDLE = _IdleConnections(max_idle=MAX_IDLE_CONNECTIONS, max_idle_s=MAX_IDLE_SECONDS)


def _idle_after_fork() -> None:
    # The parent's sockets are not this process's to use: forget them (the parent keeps its own).
    global _IDLE
    _IDLE = _IdleConnections(max_idle=MAX_IDLE_CONNECTIONS, max_idle_s=MAX_IDLE_SECONDS)


def _after_fork_in_child() -> None:
    _watchdog_after_fork()
    _idle_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


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
        (Urllib3TimeoutError, "timeout"),
        (TimeoutError, "timeout"),
        (http.client.LineTooLong, "invalid answer"),
        (http.client.HTTPException, "invalid answer"),
    ):
        if any(isinstance(cause, kind) for cause in causes):
            return label
    return "connection error"


def _read_bounded(response: HTTPResponse, limit: int) -> tuple[bytes, bool]:
    """Up to `limit` bytes of the body as sent (no decompression), and whether more was left."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = response.read(min(_READ_CHUNK_BYTES, limit + 1 - size), decode_content=False)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    data = b"".join(chunks)
    return data[:limit], len(data) > limit


def _drain(conn: HTTPConnection, response: HTTPResponse, timeout_s: float) -> None:
    """Reads and drops a short unread body so the connection can carry the next request.

    Only a body of known length up to _DRAIN_MAX_BYTES, each wait for it at most `timeout_s`;
    the call's deadline, which watches this socket, bounds the whole drain. A body that does
    not come costs the connection, never the answer already read.
    """
    remaining = response.length_remaining
    sock = conn.sock
    if remaining is None or remaining > _DRAIN_MAX_BYTES or timeout_s <= 0 or sock is None:
        return
    kept_timeout = sock.gettimeout()
    try:
        sock.settimeout(timeout_s)
        while response.read(_READ_CHUNK_BYTES, decode_content=False):
            pass
    except (HTTPError, http.client.HTTPException, OSError):
        conn.close()
        return
    sock.settimeout(kept_timeout)


def _request_target(url: str) -> tuple[str, dict[str, str]]:
    """The request line's target (path and query, quoted as `requests` quoted it), and the
    Basic authorization a `user:password@` in the URL asks for (as `requests` did)."""
    parts = urlsplit(url)
    target = requote_uri(parts.path or "/") + (
        f"?{requote_uri(parts.query)}" if parts.query else ""
    )
    auth: dict[str, str] = {}
    if parts.username is not None:
        credentials = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        auth = make_headers(basic_auth=credentials)
    return target, auth


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
    read none. A 3xx is returned like any other answer, never followed. The connection is kept
    for the next call to the same pinned target only when it ends in a known state.
    """
    started = time.monotonic()
    limit = max(0, min(max_body_bytes, MAX_BODY_BYTES))
    reusable = False
    conn = _IDLE.take(target)
    if conn is None:
        conn = _new_connection(target, timeout_s)
    with SocketDeadline(timeout_s) as deadline:
        conn.deadline = deadline  # watches the socket it opens, if it opens one
        conn.timeout = timeout_s
        if conn.sock is not None:
            # Kept alive from an earlier call: this call's deadline watches it from now on.
            # (The socket itself: once an answer says "close", conn.sock is None.)
            sock = conn.sock
            deadline.watch(lambda: conn.sock or sock)
        try:
            path, auth = _request_target(url)
            conn.request(
                "POST",
                path,
                body=body,
                headers={
                    "Accept": "*/*",
                    # identity: the bounded read counts the bytes that arrive, and a small
                    # compressed answer cannot expand into a large one.
                    "Accept-Encoding": "identity",
                    **auth,
                    **headers,
                },
                preload_content=False,
                decode_content=False,
            )
            response = conn.getresponse()
            status = response.status
            data, truncated = _read_bounded(response, limit) if limit else (b"", False)
            # The answer is complete before any draining: a drain that fails costs the
            # connection, never the answer.
            expired = deadline.expired
            if not limit and not expired:
                _drain(conn, response, min(_DRAIN_MAX_SECONDS, deadline.at - time.monotonic()))
            reusable = response.closed and not truncated
        # Bad URL text (control characters) raises ValueError before anything is sent.
        except (HTTPError, http.client.HTTPException, OSError, ValueError) as exc:
            expired = deadline.expired
            failure = "timeout" if expired else failure_class(exc)
            answer = _answer(started, failure=failure)
        else:
            answer = (
                # A socket shut down mid-answer can still parse as a complete answer; it is not.
                _answer(started, failure="timeout")
                if expired
                else _answer(started, status_code=status, body=data, truncated=truncated)
            )
    # After __exit__ an unexpired deadline never fires, so a connection given back now is not
    # shut down under the next call that takes it.
    if reusable and not deadline.expired and not conn.is_closed:
        _IDLE.give(target, conn)
    else:
        conn.close()
    return answer


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
