"""A real HTTP server on 127.0.0.1 that records webhook POSTs and answers as scripted."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Reply:
    status: int = 200
    delay_s: float = 0.0
    """Sleep this long before answering (cut short when the receiver closes)."""
    hold: threading.Event | None = None
    """Answer only once this is set (or the receiver closes)."""
    headers: dict[str, str] = field(default_factory=dict)
    drip_header_s: float = 0.0
    """Send the status line, then one header line every 0.1 s for this long."""


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float


class WebhookReceiver:
    """Replies are used in order, one per request; after them, `default` answers."""

    def __init__(self, default: Reply | None = None):
        self.default = default or Reply()
        self.requests: list[Received] = []
        self._replies: deque[Reply] = deque()
        self._changed = threading.Condition()
        self.closing = threading.Event()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.receiver = self
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    def script(self, *replies: Reply) -> None:
        self._replies.extend(replies)

    def wait_for(self, count: int, timeout_s: float = 10.0) -> list[Received]:
        with self._changed:
            if not self._changed.wait_for(lambda: len(self.requests) >= count, timeout_s):
                raise AssertionError(f"receiver got {len(self.requests)} of {count} requests")
            return list(self.requests)

    def event_ids(self) -> list[str]:
        return [r.headers["webhook-id"] for r in self.requests]

    def _take(self, request: Received) -> Reply:
        with self._changed:
            self.requests.append(request)
            self._changed.notify_all()
            return self._replies.popleft() if self._replies else self.default

    def __enter__(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.closing.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        receiver: WebhookReceiver = self.server.receiver
        length = int(self.headers.get("Content-Length", 0))
        body = self.rfile.read(length)
        if len(body) < length:
            return  # the sender died mid-request (a killed worker): no whole event arrived
        reply = receiver._take(
            Received(
                path=self.path,
                headers={k.lower(): v for k, v in self.headers.items()},
                body=body,
                at=time.monotonic(),
            )
        )
        try:
            if reply.delay_s:
                receiver.closing.wait(reply.delay_s)
            if reply.hold is not None:
                while not (reply.hold.is_set() or receiver.closing.is_set()):
                    reply.hold.wait(0.05)
            if reply.drip_header_s:
                self._drip(reply, receiver)
                return
            self.send_response(reply.status)
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", "2")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(b"ok")
        except OSError:
            pass  # the sender gave up and closed the connection: that is what some tests prove

    def _drip(self, reply: Reply, receiver: WebhookReceiver) -> None:
        self.wfile.write(f"HTTP/1.1 {reply.status} OK\r\n".encode())
        self.wfile.flush()
        deadline = time.monotonic() + reply.drip_header_s
        while time.monotonic() < deadline and not receiver.closing.wait(0.1):
            self.wfile.write(b"X-Drip: .\r\n")
            self.wfile.flush()
        self.wfile.write(b"Content-Length: 0\r\nConnection: close\r\n\r\n")
        self.wfile.flush()

    def log_message(self, format, *args) -> None:
        pass


class _Server(ThreadingHTTPServer):
    receiver: WebhookReceiver

    def handle_error(self, request, client_address) -> None:
        pass  # a sender hanging up mid-answer is expected here, not an error
