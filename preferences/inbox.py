"""The in-app inbox: a user's messages, newest first, and marking one read. No ORM here.

The messages are this app's table (`preferences.models.InboxMessage`), written by the worker
when it sends on the in_app channel (delivery, above this app in the layers, writes it in its
finish); this app reads them and marks them read through `InboxRepository`.

Invariants protected here:
- an inbox read is idempotent and scoped to the client and the user.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

from notifyqueue.cursors import cursor_decode, cursor_encode
from notifyqueue.errors import NotFound
from preferences.repositories import InboxPage, InboxPosition, InboxRecord, InboxRepository

INBOX_PAGE_SIZE_DEFAULT = 50
INBOX_PAGE_SIZE_MAX = 200


class InboxMessageNotFound(NotFound):
    def __init__(self, message_id: str) -> None:
        super().__init__(f"No inbox message {message_id} for this user.")


@dataclass(frozen=True)
class InboxListPage:
    messages: list[InboxRecord]
    next_cursor: str | None


def inbox_list(
    *,
    client_id: uuid.UUID,
    user_id: str,
    unread_only: bool,
    cursor: str | None,
    page_size: int = INBOX_PAGE_SIZE_DEFAULT,
    repository: InboxRepository | None = None,
) -> InboxListPage:
    """One page of the user's in-app messages, newest first."""
    repository = repository or InboxRepository()
    page: InboxPage = repository.page(
        client_id=client_id,
        user_id=user_id,
        unread_only=unread_only,
        after=_cursor_decode(cursor) if cursor else None,
        limit=page_size,
    )
    last = page.messages[-1] if page.messages and page.has_more else None
    return InboxListPage(messages=page.messages, next_cursor=last and _cursor_encode(last))


def inbox_message_read(
    *,
    client_id: uuid.UUID,
    user_id: str,
    message_id: str,
    now: datetime,
    repository: InboxRepository | None = None,
) -> InboxRecord:
    """Marks the message read (again is fine: the first read time is kept)."""
    try:
        parsed = uuid.UUID(message_id)
    except ValueError as exc:
        raise InboxMessageNotFound(message_id) from exc
    read = (repository or InboxRepository()).mark_read(
        client_id=client_id, user_id=user_id, message_id=parsed, now=now
    )
    if read is None:
        raise InboxMessageNotFound(message_id)
    return read


def _cursor_encode(message: InboxRecord) -> str:
    return cursor_encode(created_at=message.created_at, id=message.id)


def _cursor_decode(cursor: str) -> InboxPosition:
    position = cursor_decode(cursor)
    return InboxPosition(created_at=position.created_at, id=position.id)
