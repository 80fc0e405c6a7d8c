"""Listing notifications, newest first, one cursor-paginated page at a time. No ORM here.

A cursor names the last row a page showed (its `created_at` and id) and the direction to go, so
a page costs the same however deep it is and rows created meanwhile never shift it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from notifications.repositories import (
    ListFilters,
    ListPosition,
    NotificationRecord,
    NotificationRepository,
)
from notifications.services import NotificationStore
from notifyqueue.cursors import cursor_decode, cursor_encode

PAGE_SIZE_DEFAULT = 50
PAGE_SIZE_MAX = 200


@dataclass(frozen=True)
class NotificationListPage:
    notifications: list[NotificationRecord]
    next_cursor: str | None
    previous_cursor: str | None


def notification_list(
    *,
    client_id: uuid.UUID,
    is_operator: bool,
    filters: ListFilters,
    cursor: str | None,
    page_size: int = PAGE_SIZE_DEFAULT,
    repository: NotificationStore | None = None,
) -> NotificationListPage:
    """One page of the client's notifications (an operator's: everyone's), newest first."""
    repository = repository or NotificationRepository()
    direction, position = _cursor_decode(cursor) if cursor else ("next", None)
    going_back = direction == "previous"
    page = repository.list_page(
        client_id=None if is_operator else client_id,
        filters=filters,
        after=None if going_back else position,
        before=position if going_back else None,
        limit=page_size,
    )
    records = page.records
    if not records:
        return NotificationListPage(notifications=[], next_cursor=None, previous_cursor=None)
    more_older = page.has_more if not going_back else True
    more_newer = page.has_more if going_back else position is not None
    return NotificationListPage(
        notifications=records,
        next_cursor=_cursor_encode("next", records[-1]) if more_older else None,
        previous_cursor=_cursor_encode("previous", records[0]) if more_newer else None,
    )


def _cursor_encode(direction: str, record: NotificationRecord) -> str:
    return cursor_encode(created_at=record.created_at, id=record.id, direction=direction)


def _cursor_decode(cursor: str) -> tuple[str, ListPosition]:
    position = cursor_decode(cursor, directions={"next", "previous"})
    return position.direction, ListPosition(created_at=position.created_at, id=position.id)
