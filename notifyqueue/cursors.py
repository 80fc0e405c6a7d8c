"""The keyset pagination cursor every list endpoint hands out (notifications, the inbox).

A cursor is the position of the last row a page showed, (created_at, id), as unpadded
URL-safe base64 of a small JSON object: {"t": created_at (ISO 8601, with offset),
"i": id} and, for a list that pages both ways, "d" first ("next" or "previous"). The
encoding is the one these lists have always used, so cursors already handed out keep
working. A cursor is not signed: it only says where to continue, and every list filters by
the caller's client before it is applied.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime

from notifyqueue.errors import InvalidRequest


@dataclass(frozen=True)
class Cursor:
    created_at: datetime
    id: uuid.UUID
    direction: str | None = None


def cursor_encode(*, created_at: datetime, id: uuid.UUID, direction: str | None = None) -> str:
    position = {} if direction is None else {"d": direction}
    position |= {"t": created_at.isoformat(), "i": str(id)}
    return base64.urlsafe_b64encode(json.dumps(position).encode()).decode().rstrip("=")


def cursor_decode(cursor: str, *, directions: Collection[str] = ()) -> Cursor:
    """The position in `cursor`; with `directions`, its direction must be one of them.
    Anything else (not base64, not JSON, a naive time, ...) is a 400 on `cursor`."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        position = json.loads(base64.urlsafe_b64decode(padded.encode()))
        # Anyone can write a cursor: every part must be the type this API writes.
        if type(position) is not dict or not all(type(v) is str for v in position.values()):
            raise ValueError("not a cursor")
        direction = position["d"] if directions else None
        created_at = datetime.fromisoformat(position["t"])
        if (directions and direction not in directions) or created_at.tzinfo is None:
            raise ValueError("not a cursor")
        return Cursor(created_at=created_at, id=uuid.UUID(position["i"]), direction=direction)
    except (binascii.Error, UnicodeDecodeError, ValueError, KeyError, RecursionError) as exc:
        message = "Not a cursor this API returned."
        raise InvalidRequest(f"cursor: {message}", fields={"cursor": [message]}) from exc
