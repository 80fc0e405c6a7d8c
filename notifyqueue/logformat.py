"""The log's formats, and what never reaches the log.

`QuotedValuesRemoved`: a database error's text can quote the statement's values (PostgreSQL's
`LINE 19: ... 'ada@example.com', 'Your code', ...` and `DETAIL: Key (...)=(...)`), that is
recipients, subjects, bodies and metadata, which are never logged. On the console handler,
every exception of a database error is logged by its class, SQLSTATE and frames only.

LOG_FORMAT=json: one JSON object per log line, for log pipelines.

The JSON itself comes from python-json-logger (a maintained formatter: escaping, exceptions,
`extra=` fields, non-JSON values). This subclass fixes the field names (`ts`, `level`,
`logger`, `message`, `exception`) and adds one step: every state change is logged as a
message of `key=value` pairs (notification=... client=... channel=... attempt=...
outcome=...), and each pair is lifted into a field of its own, so one notification can be
followed across processes with a query on `notification`, without a second logging call
style in the code.
"""

from __future__ import annotations

import logging
import re
import traceback
from datetime import UTC, datetime
from typing import Any

from django.db import Error as DjangoDatabaseError
from psycopg import Error as PsycopgError
from pythonjsonlogger.json import JsonFormatter as _LibraryJsonFormatter

_PAIR = re.compile(r"(?<![\w=])([a-z_]+)=([^\s=]+)")
RESERVED = frozenset({"ts", "level", "logger", "message", "exception"})


class JsonFormatter(_LibraryJsonFormatter):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("fmt", "%(levelname)s %(name)s %(message)s")
        kwargs.setdefault(
            "rename_fields", {"levelname": "level", "name": "logger", "exc_info": "exception"}
        )
        kwargs.setdefault("json_ensure_ascii", False)
        super().__init__(*args, **kwargs)

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        log_data["ts"] = (
            datetime.fromtimestamp(record.created, UTC).isoformat().replace("+00:00", "Z")
        )
        super().add_fields(log_data, record, message_dict)
        # The message's own key=value pairs; a field already set (ours or an `extra=`) wins.
        for key, value in _PAIR.findall(record.getMessage()):
            if key not in RESERVED:
                log_data.setdefault(key, int(value) if value.isdigit() else value)


class QuotedValuesRemoved(logging.Filter):
    """Rewrites a record whose exception is (or was caused by) a database error: the frames
    stay, each exception's text is replaced by its class and SQLSTATE."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc_info = record.exc_info
        if exc_info and exc_info[1] is not None and _database_error_in(exc_info[1]):
            record.exc_text = _without_texts(exc_info[1])
            record.exc_info = None
        return True


def _chain(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def _database_error_in(exc: BaseException) -> bool:
    return any(isinstance(e, DjangoDatabaseError | PsycopgError) for e in _chain(exc))


def _without_texts(exc: BaseException) -> str:
    parts = []
    for link in reversed(_chain(exc)):
        frames = "".join(traceback.format_list(traceback.extract_tb(link.__traceback__)))
        state = getattr(link, "sqlstate", None) or getattr(
            getattr(link, "__cause__", None), "sqlstate", None
        )
        name = f"{type(link).__module__}.{type(link).__qualname__}"
        what = f"{name} (SQLSTATE {state})" if state else name
        parts.append(
            f"Traceback (most recent call last):\n{frames}{what}: text not logged, it can "
            "quote the statement's values"
        )
    # Oldest first, as Python prints a chain.
    return "\n\nwhich led to:\n\n".join(parts)
