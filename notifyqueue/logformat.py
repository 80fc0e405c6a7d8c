"""LOG_FORMAT=json: one JSON object per log line, for log pipelines.

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
from datetime import UTC, datetime
from typing import Any

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
