"""Suppression rules: which address a bounce, a complaint, an opt-out or an unsubscribe
stops, for whom, and how an operator changes the list.

Invariants protected here:
- every entry is keyed by the address's counting form (notifyqueue/addresses.py
  `recipient_key`), the rate limits' normalisation: `Ada@Example.COM` and `ada@example.com`
  are one entry;
- a hard bounce suppresses the address for every client; a complaint, an opt-out or an
  unsubscribe for the client whose message caused it only;
- a removal is logged with what was removed and by whom.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from notifyqueue.addresses import recipient_key
from notifyqueue.cursors import cursor_decode, cursor_encode
from notifyqueue.errors import NotFound
from suppressions.models import EVERY_CLIENT_REASONS, Reason
from suppressions.repositories import SuppressionRecord, SuppressionRepository

log = logging.getLogger("notifyqueue.suppressions")


def suppression_reason_text(reason: str) -> str:
    """What a suppressed notification's `last_error` says."""
    return f"suppressed: {reason}"


def suppression_add(
    *,
    channel: str,
    recipient: str,
    client_id: uuid.UUID | None,
    reason: str,
    source: str,
    repository: SuppressionRepository | None = None,
) -> tuple[SuppressionRecord, bool]:
    """Suppresses `recipient` on `channel`: for every client when the reason says the address
    does not exist, else for `client_id` (an operator's entry keeps the scope it was given)."""
    if reason in EVERY_CLIENT_REASONS:
        client_id = None
    elif reason != Reason.OPERATOR and client_id is None:
        raise ValueError(f"a {reason} suppresses the address for one client")
    entry, created = (repository or SuppressionRepository()).add(
        channel=channel,
        address=recipient_key(channel, recipient),
        client_id=client_id,
        reason=reason,
        source=source[:300],
    )
    if created:
        log.info(
            "suppression added id=%s channel=%s client=%s reason=%s source=%s",
            entry.id,
            channel,
            entry.client_id or "*",
            reason,
            source[:300],
        )
    return entry, created


def suppression_remove(
    *, id: uuid.UUID, removed_by: str, repository: SuppressionRepository | None = None
) -> SuppressionRecord:
    entry = (repository or SuppressionRepository()).remove(id=id)
    if entry is None:
        raise NotFound("No such suppression.")
    log.warning(
        "suppression removed id=%s channel=%s address=%s client=%s reason=%s by=%s",
        entry.id,
        entry.channel,
        entry.address[:80],
        entry.client_id or "*",
        entry.reason,
        removed_by,
    )
    return entry


@dataclass(frozen=True)
class SuppressionListPage:
    entries: list[SuppressionRecord]
    next_cursor: str | None


def suppressions_list(
    *,
    channel: str | None,
    cursor: str | None,
    page_size: int,
    repository: SuppressionRepository | None = None,
) -> SuppressionListPage:
    after = cursor_decode(cursor) if cursor else None
    page = (repository or SuppressionRepository()).page(
        channel=channel,
        after_created_at=after and after.created_at,
        after_id=after and after.id,
        limit=page_size,
    )
    last = page.entries[-1] if page.entries and page.has_more else None
    return SuppressionListPage(
        entries=page.entries,
        next_cursor=last and cursor_encode(created_at=last.created_at, id=last.id),
    )
