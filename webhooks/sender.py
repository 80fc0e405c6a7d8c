"""One webhook POST: resolve and check the target, connect to the checked address, and give up
after a total deadline.

Invariants: no database access here (the caller records the result); a POST never follows a
redirect (a 3xx could point at an address the SSRF rules refuse) and never uses a proxy from
the environment; the whole POST (connect, send, headers, body) ends within `timeout_s` plus
scheduling slack, however slowly the receiver drips its answer.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass

import requests
from requests.adapters import HTTPAdapter
from urllib3 import PoolManager
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.exceptions import ConnectTimeoutError, HTTPError, NewConnectionError
from urllib3.util import connection as urllib3_connection

from webhooks.targets import (
    WebhookTarget,
    WebhookTargetRefused,
    WebhookTargetUnresolved,
    webhook_target_resolve,
)

USER_AGENT = "NotifyQueue-Webhooks/1.0"
# How much of an error answer is kept for the attempt's record.
ERROR_BODY_MAX_BYTES = 512


@dataclass(frozen=True)
class PostResult:
    delivered: bool
    permanent: bool
    """True when retrying cannot help (the URL is refused)."""
    status_code: int | None
    error: str | None
    duration_s: float


class _Deadline:
    """Shuts down the POST's sockets once `seconds` have passed.

    requests' read timeout applies to each socket read, so a receiver sending one byte every
    few seconds would never trip it; shutting the socket down wakes the blocked read at once.
    """

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.expired = False
        self._connections: list[tuple[HTTPConnection, socket.socket]] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._timer.cancel()

    def watch(self, conn: HTTPConnection, sock: socket.socket) -> None:
        with self._lock:
            self._connections.append((conn, sock))
            expired = self.expired
        if expired:
            self._shutdown(conn, sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            connections = list(self._connections)
        for conn, sock in connections:
            self._shutdown(conn, sock)

    @staticmethod
    def _shutdown(conn: HTTPConnection, sock: socket.socket) -> None:
        # After TLS wraps it, `sock` is detached and conn.sock is the live socket.
        for candidate in (conn.sock, sock):
            if candidate is not None and candidate.fileno() != -1:
                with contextlib.suppress(OSError):
                    candidate.shutdown(socket.SHUT_RDWR)
                return


class _Pin:
    """Where the POST's connections go: the checked address, under the deadline's watch."""

    def __init__(self, address: str, deadline: _Deadline):
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
        self.deadline.watch(conn, sock)
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


def _timed_out(started: float, timeout_s: float) -> PostResult:
    elapsed = time.monotonic() - started
    return PostResult(
        False, False, None, f"timed out after {elapsed:.2f}s (limit {timeout_s:g}s)", elapsed
    )


def webhook_post_to(
    *, url: str, target: WebhookTarget, body: bytes, headers: dict[str, str], timeout_s: float
) -> PostResult:
    """POSTs `body` to `url`, connecting only to `target.address`; 2xx means delivered."""
    started = time.monotonic()
    with _Deadline(timeout_s) as deadline, requests.Session() as session:
        session.trust_env = False  # no proxies or .netrc from the environment
        adapter = _PinnedAdapter(_Pin(target.address, deadline))
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        try:
            response = session.post(
                url,
                data=body,
                headers={"User-Agent": USER_AGENT, "Content-Type": "application/json", **headers},
                timeout=(timeout_s, timeout_s),
                allow_redirects=False,
                stream=True,
            )
            with response:
                status = response.status_code
                excerpt = b"" if 200 <= status < 300 else response.raw.read(ERROR_BODY_MAX_BYTES)
        # Reading the raw body raises urllib3's errors, not requests'.
        except (requests.RequestException, HTTPError, OSError) as exc:
            if deadline.expired or isinstance(exc, requests.Timeout | TimeoutError):
                return _timed_out(started, timeout_s)
            error = f"{type(exc).__name__}: {exc}"
            return PostResult(False, False, None, error, time.monotonic() - started)
        if deadline.expired:
            # A socket shut down mid-headers can still parse as a complete answer; it is not one.
            return _timed_out(started, timeout_s)
    elapsed = time.monotonic() - started
    if 200 <= status < 300:
        return PostResult(True, False, status, None, elapsed)
    text = excerpt.decode("utf-8", "replace").strip()
    error = f"HTTP {status}" + (f": {text}" if text else "")
    return PostResult(False, False, status, error, elapsed)


def webhook_post(
    *, url: str, body: bytes, headers: dict[str, str], timeout_s: float, allow_private: bool
) -> PostResult:
    """Checks `url` against the SSRF rules after resolving it, then POSTs to that address."""
    started = time.monotonic()
    try:
        target = webhook_target_resolve(url, allow_private=allow_private)
    except WebhookTargetRefused as exc:
        return PostResult(False, True, None, str(exc), time.monotonic() - started)
    except WebhookTargetUnresolved as exc:
        return PostResult(False, False, None, str(exc), time.monotonic() - started)
    return webhook_post_to(url=url, target=target, body=body, headers=headers, timeout_s=timeout_s)
