"""Servers on 127.0.0.1 that play a provider or a webhook endpoint in tests, all in one place:

- `LoopbackProvider`: a well-behaved HTTP provider that honours idempotency keys, and can hold
  a request after accepting it (a worker dying mid-call).
- `ScriptedProvider`: an HTTP provider whose answer depends on the recipient (hangs,
  redirects, huge or garbage bodies, rejections, busy answers), for the fault suite.
- `ScriptedHTTPServer`: a raw TCP server that reads one HTTP request per connection and answers
  however a test scripts it: any bytes, dripped slowly, an endless body, a reset, or nothing at
  all. http.server cannot misbehave like this, and the outbound transport must survive all of it.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Request:
    head: str
    body: bytes

    @property
    def headers(self) -> dict[str, str]:
        lines = self.head.split("\r\n")[1:]
        return {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}

    @property
    def json(self):
        return json.loads(self.body)


@dataclass
class Connection:
    sock: socket.socket
    closing: threading.Event
    sent: list[int] = field(default_factory=lambda: [0])
    request: Request | None = None
    """The request this connection carried, for scripts that answer by its content."""

    def send(self, data: bytes) -> bool:
        """False once the other side has gone."""
        try:
            self.sock.sendall(data)
        except OSError:
            return False
        self.sent[0] += len(data)
        return True

    def drip(self, data: bytes, *, every_s: float) -> None:
        for i in range(len(data)):
            if not self.send(data[i : i + 1]) or self.closing.wait(every_s):
                return

    def reset(self) -> None:
        """Closes with RST instead of FIN: the client sees "connection reset"."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()

    def hang(self, seconds: float) -> None:
        self.closing.wait(seconds)


def http_answer(status: int, body: bytes | str | dict = b"", headers: dict | None = None) -> bytes:
    if isinstance(body, dict | list):
        body = json.dumps(body)
    if isinstance(body, str):
        body = body.encode()
    lines = [f"HTTP/1.1 {status} Scripted", f"Content-Length: {len(body)}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


Script = Callable[[Connection], None]


class ScriptedHTTPServer:
    """Each connection's request is recorded, then the next script (or `default`) answers."""

    def __init__(self, *scripts: Script, default: Script | None = None):
        self.scripts = list(scripts)
        self.default = default
        self.requests: list[Request] = []
        self.bytes_sent = 0
        self.closing = threading.Event()
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self._listener.getsockname()[1]

    def url(self, path: str = "/messages") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self.closing.set()
        self._thread.join()
        self._listener.close()

    def _serve(self) -> None:
        while not self.closing.is_set():
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._handle, args=(sock,), daemon=True).start()

    def _handle(self, sock: socket.socket) -> None:
        sock.settimeout(10)
        conn = Connection(sock, self.closing)
        try:
            request = self._read_request(sock)
            if request is None:
                return
            conn.request = request
            with self._lock:
                self.requests.append(request)
                script = self.scripts.pop(0) if self.scripts else self.default
            if script is not None:
                script(conn)
        except OSError:
            pass
        finally:
            with self._lock:
                self.bytes_sent += conn.sent[0]
            if sock.fileno() != -1:
                sock.close()

    @staticmethod
    def _read_request(sock: socket.socket) -> Request | None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return None
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        request = Request(head.decode("latin-1"), b"")
        length = int(request.headers.get("content-length", "0"))
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
        request.body = body
        return request


def answer(status: int, body: bytes | str | dict = b"", headers: dict | None = None) -> Script:
    data = http_answer(status, body, headers)
    return lambda conn: conn.send(data)


@dataclass
class ProviderCall:
    key: str
    body: dict


@dataclass
class LoopbackProvider:
    """A real HTTP provider on 127.0.0.1 that honours idempotency keys like a real one.

    `hold` (when set by the test) makes each request wait until `release` is set, after the
    provider has already accepted the message: what a worker dying mid-call looks like.
    """

    calls: list[ProviderCall] = field(default_factory=list)
    sent: dict[str, str] = field(default_factory=dict)
    received: threading.Event = field(default_factory=threading.Event)
    hold: bool = False
    release: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> str:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                key = self.headers["Idempotency-Key"]
                with provider._lock:
                    provider.calls.append(ProviderCall(key, body))
                    message_id = provider.sent.setdefault(key, f"msg-{uuid.uuid4()}")
                provider.received.set()
                if provider.hold:
                    provider.release.wait(30)
                answer = json.dumps({"message_id": message_id}).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the worker died while waiting: the point of some tests

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_port}/send"

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Call:
    key: str
    recipient: str
    at: float


@dataclass
class ScriptedProvider:
    """An HTTP provider on loopback whose answer depends on the recipient:

    `hang` sleeps past the worker's deadline, then accepts; `redirect` answers 307; `longid`
    accepts with a 300-character message id; `hugeid` with a 100,000-character one; `nulid`
    with NUL and control characters in it; `garbage` accepts with a body that is not JSON;
    `huge` accepts with a 2 MB body; `reject` answers 400; `busy` answers 503 on a key's first
    two calls. Anything else is accepted. Like a real provider, a key it accepted before is
    answered with the same id and not sent again; `sends` holds each key's one real send.
    While `down` is set it is out of service: every call is answered 503 and nothing is sent.
    """

    delay_s: float = 0.0
    down: bool = False
    calls: list[Call] = field(default_factory=list)
    sends: dict[str, Call] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __enter__(self) -> ScriptedProvider:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                key, recipient = self.headers["Idempotency-Key"], body["recipient"]
                provider._answer(self, key, recipient)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.socket.listen(256)  # not socketserver's 5: a worker's 200 sends connect at once
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/send"
        return self

    def __exit__(self, *exc_info) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _answer(self, handler: BaseHTTPRequestHandler, key: str, recipient: str) -> None:
        now = time.time()
        with self._lock:
            self.calls.append(Call(key, recipient, now))
            tries = sum(1 for c in self.calls if c.key == key)
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.down:
            return self._reply(handler, 503, b"service unavailable")
        if "redirect" in recipient:
            return self._reply(handler, 307, b"", {"Location": "http://127.0.0.1:9/elsewhere"})
        if "reject" in recipient:
            return self._reply(handler, 400, b"no such recipient")
        if "busy" in recipient and tries <= 2:
            return self._reply(handler, 503, b"busy " * 1000)
        if "hang" in recipient and tries <= 1:
            time.sleep(3)  # past the 1 s provider timeout: the worker gives up first
        with self._lock:
            first = key not in self.sends
            if first:
                self.sends[key] = Call(key, recipient, now)
        message_id = f"msg-{key}"
        if "longid" in recipient:
            message_id = "L" * 300
        elif "hugeid" in recipient:
            message_id = "H" * 100_000
        elif "nulid" in recipient:
            message_id = "id\x00with\x01nul"
        if "garbage" in recipient:
            return self._reply(handler, 200, b"\xff\xfe<html>accepted?</html>\x00")
        if "huge" in recipient and "hugeid" not in recipient:
            return self._reply(handler, 200, b"x" * 2_000_000)
        return self._reply(handler, 200, json.dumps({"message_id": message_id}).encode())

    @staticmethod
    def _reply(handler, status: int, body: bytes, headers: dict | None = None) -> None:
        try:
            handler.send_response(status)
            for name, value in (headers or {}).items():
                handler.send_header(name, value)
            handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            handler.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the worker gave up (timeout) or died: what some tests are about
