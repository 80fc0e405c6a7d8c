"""What a test's code sent to PostgreSQL, counted on the wire."""

from __future__ import annotations

import contextlib
import re
import tempfile

from django.db import connection
from psycopg import pq


@contextlib.contextmanager
def statements_sent():
    """The SQL of every statement sent on Django's connection meanwhile, as PostgreSQL's
    client library logs the protocol (PQtrace): what Django's query log would miss, statements
    sent on a psycopg cursor of the same connection included."""
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    sent: list[str] = []
    with tempfile.TemporaryFile() as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            yield sent
        finally:
            pgconn.untrace()
        trace.seek(0)
        text = trace.read().decode(errors="replace")
    # One message per "F|B <tab> length <tab> type" line; a statement's text spans lines.
    messages = list(re.finditer(r"^([FB])\t\d+\t(\w+)", text, re.MULTILINE))
    ends = [following.start() for following in messages[1:]] + [len(text)] * bool(messages)
    for message, end in zip(messages, ends, strict=True):
        if message[1] == "F" and message[2] in ("Query", "Parse"):
            sent.append(text[message.end() : end])
