"""The one keyset cursor codec (notifyqueue.cursors): the encoding the lists always used."""

from __future__ import annotations

import base64
import json
import uuid
from datetime import UTC, datetime

import pytest

from notifyqueue.cursors import Cursor, cursor_decode, cursor_encode
from notifyqueue.errors import InvalidRequest

AT = datetime(2026, 12, 1, 12, 0, 1, 20_000, tzinfo=UTC)
ID = uuid.UUID("3f6c2b0e-0000-4000-8000-000000000001")


def legacy(position: dict) -> str:
    """How notifications and the inbox each encoded their cursors before they shared one."""
    return base64.urlsafe_b64encode(json.dumps(position).encode()).decode().rstrip("=")


def test_the_encoding_is_unchanged_so_cursors_already_handed_out_keep_working():
    both_ways = {"d": "previous", "t": AT.isoformat(), "i": str(ID)}
    one_way = {"t": AT.isoformat(), "i": str(ID)}
    assert cursor_encode(created_at=AT, id=ID, direction="previous") == legacy(both_ways)
    assert cursor_encode(created_at=AT, id=ID) == legacy(one_way)
    assert cursor_decode(legacy(both_ways), directions={"next", "previous"}) == Cursor(
        AT, ID, "previous"
    )
    assert cursor_decode(legacy(one_way)) == Cursor(AT, ID)


@pytest.mark.parametrize(
    "cursor",
    [
        "not base64!",
        legacy({"t": AT.isoformat()}),
        legacy({"t": "2026-12-01T12:00:00", "i": str(ID)}),  # naive time
        legacy({"t": AT.isoformat(), "i": "x"}),
        legacy({"d": "sideways", "t": AT.isoformat(), "i": str(ID)}),
        legacy({"t": AT.isoformat(), "i": str(ID)}),  # no direction where one is needed
        legacy([1, 2]),
        base64.urlsafe_b64encode(b"\xff\xfe").decode(),
    ],
)
def test_anything_else_is_a_400_on_cursor(cursor):
    with pytest.raises(InvalidRequest) as caught:
        cursor_decode(cursor, directions={"next", "previous"})
    assert caught.value.fields == {"cursor": ["Not a cursor this API returned."]}
