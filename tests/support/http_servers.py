"""A raw TCP server on 127.0.0.1 that reads one HTTP request per connection and answers however
a test scripts it: any bytes, dripped slowly, an endless body, a reset, or nothing at all.

http.server cannot misbehave like this, and the outbound transport must survive all of it.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field


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
