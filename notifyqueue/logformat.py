"""LOG_FORMAT=json: one JSON object per log line, for log pipelines.

Every state change is logged as a message of `key=value` pairs (notification=... client=...
channel=... attempt=... outcome=...). This formatter keeps the message and lifts each pair
into a field of its own, so one notification can be followed across processes with a query
on `notification`, without a second logging call style in the code.
"""

from __future__ import annotations

import json
import logging
import re
from datetime import UTC, datetime

_PAIR = re.compile(r"(?<![\w=])([a-z_]+)=([^\s=]+)")
RESERVED = frozenset({"ts", "level", "logger", "message", "exception"})


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat().replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": message,
        }
        for key, value in _PAIR.findall(message):
            if key not in RESERVED:
                entry.setdefault(key, int(value) if value.isdigit() else value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)
