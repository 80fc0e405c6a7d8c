"""gunicorn's threaded worker, reading each request whole before a thread takes it, and with
the thread that answered a request staying on its connection for the next one.
notifyqueue/gunicorn_conf.py names it (`worker_class`).

**Slow clients never hold a thread.** gunicorn's gthread worker gives a connection to a pool
thread as soon as its first byte arrives, and the thread then reads the rest with blocking
reads and no deadline: a client sending its headers or body a byte at a time holds that
thread for as long as it likes, and one such client per thread stops the process answering
anyone (`/status` too). Here the main thread's poller reads every request (its head, and a
body of up to BUFFERED_BODY_MAX_BYTES) without blocking, into the connection's own buffer, and
hands it to a thread only once it is complete; a request not complete REQUEST_READ_TIMEOUT_S
after its connection opened (or, on a kept-alive connection, after its first byte) is
answered 408 and closed. A thread therefore only ever parses bytes already in memory, as behind a
buffering proxy (tests/integration/test_api_slow_clients.py). A body declared larger than
BUFFERED_BODY_MAX_BYTES is answered 413 without being read, as the API would (Django's
DATA_UPLOAD_MAX_MEMORY_SIZE), and a head past HEAD_MAX_BYTES 431. TLS and HTTP/2 are left to
the proxy in front; with gunicorn's own TLS the worker is gthread as it was.

gunicorn's gthread worker hands a kept-alive connection back to its main thread after every
answer: the request's thread writes to a pipe to wake the main thread, which registers the
socket with its poller, wakes again on the client's next request, and hands the connection to
a pool thread (another wake-up). Every one of those wake-ups crosses threads, and on a busy
process each waits for the GIL as well. For a client that sends its next request as soon as
it has the answer (a proxy's kept-alive upstream connections, a client library's session),
that round trip through the main thread cost about a quarter of the API's CPU per create.

Here the thread that answered waits up to LINGER_MS for that connection's next request and
serves it itself; a connection quiet that long goes back to the poller as in gthread. A
thread lingers only while its process has no more connections than threads, so a waiting
connection always has a thread to go to: one client sending request after request never keeps
another client waiting (tests/integration/test_gunicorn_worker.py). With more connections than
threads (a proxy with a large pool) the worker is gthread.

Its answers go out in one write: gunicorn writes an answer's headers, then its body, two
segments on the wire for an answer that fits in one, each a wake-up for the client and work
the kernel charges to the sender (`OneWriteResponse`). Their Date header is formatted once a
second, not for every answer (`http_date_now`).

Each worker process reads its settings as plain attributes, copied when it starts
(`config_freeze`): gunicorn's `Config` answers every read through `__getattr__`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import select
import selectors
import time
from collections import deque

from gunicorn import util
from gunicorn.config import Config
from gunicorn.http import wsgi
from gunicorn.workers.gthread import TConn, ThreadWorker

# The largest first body write sent in one write with the headers: joining them copies it, and
# a body this large is several segments whatever is done.
ONE_WRITE_MAX_BYTES = 64 * 1024
# How long a thread waits for the next request on the connection it answered. Short: a
# connection accepted meanwhile may wait this long for a thread.
LINGER_MS = 5
# A request must arrive whole (head and body) within this long of its first byte, and a new
# connection must send its first byte within it; otherwise 408 and the connection is closed.
# Generous for any real client on a slow link: a 64 KB create at 10 KB/s takes 7 s.
REQUEST_READ_TIMEOUT_S = 15.0
# Bodies up to Django's DATA_UPLOAD_MAX_MEMORY_SIZE default are read into memory before a
# thread sees them; a request declaring a larger one is answered 413 without reading it, as
# the application would.
BUFFERED_BODY_MAX_BYTES = 2_621_440
# A request head not ended within this many bytes is answered 431 (gunicorn's own limits
# refuse long lines and fields; this bounds what is held in memory before they apply).
HEAD_MAX_BYTES = 64 * 1024
READ_CHUNK_BYTES = 64 * 1024


def _refusal(status: bytes, code: str, message: str) -> bytes:
    """A whole HTTP answer in the project's error format; the connection closes after it."""
    body = json.dumps({"error": {"code": code, "message": message, "fields": {}}}).encode()
    return (
        b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nConnection: close\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (status, len(body), body)
    )


REQUEST_TIMEOUT_ANSWER = _refusal(
    b"408 Request Timeout", "request_timeout", "The request took too long to arrive."
)
HEAD_TOO_LARGE_ANSWER = _refusal(
    b"431 Request Header Fields Too Large",
    "headers_too_large",
    f"The request's head is larger than {HEAD_MAX_BYTES} bytes.",
)
BODY_TOO_LARGE_ANSWER = _refusal(
    b"413 Content Too Large",
    "payload_too_large",
    f"The request body is larger than {BUFFERED_BODY_MAX_BYTES} bytes.",
)
# The thread's answer when the connection's next request has begun but is not all there: the
# main thread reads the rest (`finish_request`).
_READ_REST = object()


class LingeringThreadWorker(ThreadWorker):
    def init_process(self):
        config_freeze(self.cfg)
        # Connections whose request is being read by the main thread, oldest deadline first.
        self.reading_conns: deque[TConn] = deque()
        # TLS and HTTP/2 negotiation happen in gunicorn's own code, on a thread.
        self.reads_whole_requests = not self.cfg.is_ssl and self.cfg.http2_cleartext == "off"
        super().init_process()

    # --- reading requests whole, in the main thread ---

    def accept(self, listener):
        if not self.reads_whole_requests:
            return super().accept(listener)
        try:
            client_sock, client_addr = listener.accept()
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        self.nr_conns += 1
        conn = TConn(self.cfg, client_sock, client_addr, listener.getsockname())
        conn.request_bytes = bytearray()
        self.request_read_start(conn)

    def on_client_socket_readable(self, conn, client):
        if not self.reads_whole_requests:
            return super().on_client_socket_readable(conn, client)
        self.poller.unregister(client)
        self.keepalived_conns.remove(conn)
        conn.request_bytes = bytearray()
        self.request_read_start(conn)
        self.request_read_more(conn)

    def request_read_start(self, conn: TConn) -> None:
        conn.sock.setblocking(False)
        conn.read_deadline = time.monotonic() + REQUEST_READ_TIMEOUT_S
        self.reading_conns.append(conn)
        self.poller.register(
            conn.sock, selectors.EVENT_READ, lambda _sock: self.request_read_more(conn)
        )

    def request_read_more(self, conn: TConn) -> None:
        try:
            data = conn.sock.recv(READ_CHUNK_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the client went away
            self.request_read_close(conn, answer=None)
            return
        conn.request_bytes += data
        self.request_read_check(conn)

    def request_read_check(self, conn: TConn) -> None:
        """Dispatches the request when it is whole, refuses it when it is too large, or
        leaves it reading."""
        state = request_state(conn.request_bytes)
        if state is True:
            self.request_read_end(conn)
            self.request_dispatch(conn)
        elif state is not False:
            self.request_read_close(conn, answer=state)

    def request_read_end(self, conn: TConn) -> None:
        self.poller.unregister(conn.sock)
        self.reading_conns.remove(conn)

    def request_read_close(self, conn: TConn, *, answer: bytes | None) -> None:
        self.request_read_end(conn)
        self.nr_conns -= 1
        if answer:
            # A full send buffer or a gone client: closing is the answer then.
            with contextlib.suppress(OSError):
                conn.sock.send(answer)
        conn.close()

    def request_dispatch(self, conn: TConn) -> None:
        """Hands a connection whose request is whole in memory to a pool thread."""
        conn.sock.setblocking(True)
        conn.init()
        conn.parser.unreader.unread(bytes(conn.request_bytes))
        conn.request_bytes = bytearray()
        conn.data_ready = True
        self.enqueue_req(conn)

    def murder_pending(self):
        super().murder_pending()
        now = time.monotonic()
        while self.reading_conns and self.reading_conns[0].read_deadline <= now:
            self.request_read_close(self.reading_conns[0], answer=REQUEST_TIMEOUT_ANSWER)
        if not self.alive:
            # Stopping: a connection that has sent nothing yet is not waited for.
            for conn in [c for c in self.reading_conns if not c.request_bytes]:
                self.request_read_close(conn, answer=None)

    def finish_request(self, conn, fs):
        if not self.reads_whole_requests or fs.cancelled() or fs.exception() is not None:
            return super().finish_request(conn, fs)
        result = fs.result()
        if result is _READ_REST and not self.alive:
            self.nr_conns -= 1
            conn.close()
        elif result is _READ_REST:
            self.request_read_start(conn)
            self.request_read_check(conn)
        elif result is True and conn.parser.unreader.buf.getvalue():
            # The next request began behind this one (pipelined): read it whole first.
            conn.request_bytes = bytearray(conn.parser.unreader.take_buffered())
            self.request_read_start(conn)
            self.request_read_check(conn)
        else:
            super().finish_request(conn, fs)

    # --- a thread staying on the connection it answered ---

    def handle(self, conn):
        while True:
            keepalive = super().handle(conn)
            if keepalive is not True or conn.is_http2 or not self.alive:
                return keepalive
            # nr_conns is counted by the main thread; read under the GIL, a stale value costs
            # at most one LINGER_MS.
            if self.nr_conns > self.cfg.threads:
                return keepalive
            # Bytes read ahead (a pipelined request) are the next request already.
            if not conn.parser.unreader.buf.getvalue():
                poller = select.poll()
                poller.register(conn.sock, select.POLLIN)
                try:
                    if not poller.poll(LINGER_MS):
                        return keepalive
                except OSError:
                    return keepalive
                if self.reads_whole_requests and not self.next_request_whole(conn):
                    return _READ_REST

    def next_request_whole(self, conn: TConn) -> bool:
        """Reads what the client has sent of its next request without waiting. True when it
        is whole (the parser will find it) or the client closed, False when the main thread
        must read the rest or refuse it (the bytes are kept in `conn.request_bytes`)."""
        conn.sock.setblocking(False)
        try:
            data = conn.sock.recv(READ_CHUNK_BYTES)
        except (BlockingIOError, InterruptedError):
            data = b"", False
        except OSError:
            data = b"", True
        else:
            data = data, True
        finally:
            conn.sock.setblocking(True)
        received, readable = data
        if readable and (received == b"" or request_state(received) is True):
            # An empty read is the client closing: the parser sees it and ends the connection.
            conn.parser.unreader.unread(received)
            return True
        conn.request_bytes = bytearray(received)
        return False


def request_state(data: bytes | bytearray) -> bool | bytes:
    """True when `data` holds a whole HTTP/1 request head and the body it declares, False
    while it does not yet, or the answer that refuses it (a head or a declared body past this
    module's limits). A head the parser will refuse (a bad Content-Length) counts as whole:
    gunicorn's parser answers it."""
    head_end = data.find(b"\r\n\r\n")
    if head_end < 0:
        return HEAD_TOO_LARGE_ANSWER if len(data) > HEAD_MAX_BYTES else False
    body_has = len(data) - head_end - 4
    length = 0
    for line in bytes(data[:head_end]).split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"transfer-encoding" and b"chunked" in value.lower():
            if body_has > BUFFERED_BODY_MAX_BYTES:
                return BODY_TOO_LARGE_ANSWER
            # The last chunk, then the trailers' empty line.
            return data.endswith(b"0\r\n\r\n")
        if name == b"content-length":
            try:
                length = int(value.strip())
            except ValueError:
                return True
    if length > BUFFERED_BODY_MAX_BYTES:
        return BODY_TOO_LARGE_ANSWER
    return body_has >= length


def config_freeze(cfg: Config) -> None:
    """Every setting's value held as a plain attribute of `cfg`, for the worker process's life.

    gunicorn's `Config` answers each `cfg.name` in `__getattr__`: a failed look-up first, then
    the settings dict and the setting's `get()`. Reading a request and writing its answer reads
    some twenty settings, in the service about 3 % of the API's Python time under load. A
    worker's settings do not change once it runs
    (gunicorn applies a reload by starting new workers), so its process holds each value where
    normal attribute look-up finds it first. A name the class itself defines (a property such
    as `worker_class`, a method) is left to the class."""
    defined = set(dir(type(cfg)))
    for name, setting in cfg.settings.items():
        if name not in defined:
            object.__setattr__(cfg, name, setting.get())


class OneWriteResponse(wsgi.Response):
    """gunicorn's HTTP/1 answer, its headers written with the first bytes of its body.

    Only a write of the application's body holds the headers back (`write`); gunicorn's other
    paths (a file sent with sendfile, an answer with no body, `close` with nothing written)
    send them as they always did, through `send_headers`."""

    _hold = False
    _held: bytes | None = None

    def default_headers(self):
        # gunicorn's own (wsgi.Response.default_headers), with the Date of `http_date_now`.
        if self.upgrade:
            connection = "upgrade"
        elif self.should_close():
            connection = "close"
        else:
            connection = "keep-alive"
        major, minor = self.req.version
        headers = [
            f"HTTP/{major}.{minor} {self.status}\r\n",
            f"Server: {self.version}\r\n",
            f"Date: {http_date_now()}\r\n",
            f"Connection: {connection}\r\n",
        ]
        if self.chunked:
            headers.append("Transfer-Encoding: chunked\r\n")
        return headers

    def send_headers(self):
        if not self._hold or self.headers_sent:
            return super().send_headers()
        # gunicorn's own header block, as its send_headers builds it.
        lines = self.default_headers()
        lines.extend([f"{name}: {value}\r\n" for name, value in self.headers])
        self._held = util.to_bytestring("".join(lines) + "\r\n", "latin-1")
        self.headers_sent = True

    def write(self, arg):
        if self.headers_sent:
            return super().write(arg)
        self._hold = True
        try:
            super().write(arg)  # its send_headers holds them; _emit_body sends them
        finally:
            self._hold = False
            held, self._held = self._held, None
            if held is not None:  # no body bytes went out (none to send, or none allowed)
                util.write(self.sock, held)

    def _emit_body(self, data):
        held, self._held = self._held, None
        if held is None:
            return super()._emit_body(data)
        if len(data) > ONE_WRITE_MAX_BYTES:
            util.write(self.sock, held)
            return super()._emit_body(data)
        if self.chunked:
            data = b"%X\r\n%s\r\n" % (len(data), data)
        self.sock.sendall(held + data)


# The second `http_date_now` last formatted, and its Date. Two threads crossing into a new second
# may both format it; either's value is the same.
_date_now: tuple[int, str] = (0, "")


def http_date_now() -> str:
    """The Date header's value for now (RFC 9110's IMF-fixdate, whole seconds), formatted at
    most once a second: gunicorn's `util.http_date()` formats it with `email.utils` for every
    answer, about 3 % of the API's Python under load."""
    global _date_now
    second = int(time.time())
    if _date_now[0] != second:
        _date_now = (second, util.http_date(second))
    return _date_now[1]


# gunicorn builds every HTTP/1 answer from this name (`wsgi.create`; HTTP/2 passes its own
# class). gunicorn imports this module in its master to load the worker class named in
# notifyqueue/gunicorn_conf.py, before it forks any worker.
wsgi.Response = OneWriteResponse
