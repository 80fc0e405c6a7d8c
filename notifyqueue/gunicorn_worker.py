"""gunicorn's threaded worker, with the thread that answered a request staying on its
connection for the next one. notifyqueue/gunicorn.conf.py names it (`worker_class`).

gunicorn's gthread worker hands a kept-alive connection back to its main thread after every
answer: the request's thread writes to a pipe to wake the main thread, which registers the
socket with its poller, wakes again on the client's next request, and hands the connection to
a pool thread (another wake-up). Every one of those wake-ups crosses threads, and on a busy
process each waits for the GIL as well. For a client that sends its next request as soon as
it has the answer (a proxy's kept-alive upstream connections, a client library's session),
that round trip through the main thread cost about a quarter of the API's CPU per create
(docs/performance.md, "Tenth round").

Here the thread that answered waits up to LINGER_MS for that connection's next request and
serves it itself; a connection quiet that long goes back to the poller as in gthread. A
thread lingers only while its process has no more connections than threads, so a waiting
connection always has a thread to go to: one client sending request after request never keeps
another client waiting (tests/integration/test_gunicorn_worker.py). With more connections than
threads (a proxy with a large pool) the worker is gthread.
"""

from __future__ import annotations

import select

from gunicorn.workers.gthread import ThreadWorker

# How long a thread waits for the next request on the connection it answered. Short: a
# connection accepted meanwhile may wait this long for a thread.
LINGER_MS = 5


class LingeringThreadWorker(ThreadWorker):
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
