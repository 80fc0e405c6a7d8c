"""gunicorn's threaded worker, with the thread that answered a request staying on its
connection for the next one. notifyqueue/gunicorn.conf.py names it (`worker_class`).

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

import select
import time

from gunicorn import util
from gunicorn.config import Config
from gunicorn.http import wsgi
from gunicorn.workers.gthread import ThreadWorker

# The largest first body write sent in one write with the headers: joining them copies it, and
# a body this large is several segments whatever is done.
ONE_WRITE_MAX_BYTES = 64 * 1024
# How long a thread waits for the next request on the connection it answered. Short: a
# connection accepted meanwhile may wait this long for a thread.
LINGER_MS = 5


class LingeringThreadWorker(ThreadWorker):
    def init_process(self):
        config_freeze(self.cfg)
        super().init_process()

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
# notifyqueue/gunicorn.conf.py, before it forks any worker.
wsgi.Response = OneWriteResponse
