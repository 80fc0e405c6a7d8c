"""Digests: many notifications, one message. No ORM here.

A create with a `digest_key` (notifications/services.py) goes through
`notification_digest_create`: the first of its identity (client, channel, user or recipient,
digest key) in a window is queued as usual and opens the window's bucket; the others inside
the window join the bucket, PENDING but never claimed (`held_reason` `digest`). This module is
the other half: the close, which a worker runs as part of its upkeep (`DigestCloser`, called by
delivery/worker.py).

Invariants protected here:
- each collected notification ends in exactly one state: DIGESTED naming the bucket's one
  digest, or CANCELLED or EXPIRED if that came first; never both, whichever worker closes;
- one worker closes a bucket at a time (a claim with a token, SKIP LOCKED), every write of the
  close is guarded by that token, and the digest's id is chosen by the first claim and kept by
  every later one: a worker that stalls or dies mid-close leaves the bucket to another, which
  goes on where it stopped and creates the same digest, once (its id and idempotency key);
- a close does bounded work per statement and per turn of the worker's loop (`batch` rows a
  statement, `rows_per_turn` a turn), whatever the bucket's size: marking 100,000 rows never
  holds more than one batch's row locks, nor the worker's loop for long;
- the digest's body is bounded: at most DIGEST_ITEMS_SHOWN lines, fewer if the rendered body
  would pass MAX_BODY_BYTES, then "and N more";
- the digest is an ordinary notification once created: every send-time stage applies to it.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

from monitoring import metrics
from notifyqueue.errors import InvalidRequest
from notifyqueue.sqlgateway import Queries
from notifyqueue.vocabulary import MAX_BODY_BYTES
from templates.repositories import TemplateRecord, TemplateRepository
from templates.services import Rendered, template_render

log = logging.getLogger("notifyqueue.notifications")

QUERIES = Queries(Path(__file__).resolve().parent / "sql" / "digests.sql")

# Lines of `{digest_items}` at most; past them (or past the body bound), "and N more".
DIGEST_ITEMS_SHOWN = 50
# One item of a digest's `{digest_items}`: at most this many characters.
DIGEST_ITEM_LINE_MAX = 200


def digest_item_line(*, subject: str, body: str) -> str:
    """A notification as one line of a digest: its rendered subject, or its body where it has
    none, on one line, at most DIGEST_ITEM_LINE_MAX characters."""
    text = " ".join((subject if subject.strip() else body).split())
    if len(text) > DIGEST_ITEM_LINE_MAX:
        text = text[: DIGEST_ITEM_LINE_MAX - 1] + "…"
    return text


@dataclass(frozen=True)
class DigestClaim:
    """A bucket this worker holds for its close."""

    id: uuid.UUID
    client_id: uuid.UUID
    digest_key: str
    channel: str
    recipient: str
    user_id: str | None
    template: str
    closes_at: Any
    collected: int
    digest_id: uuid.UUID
    claim_token: uuid.UUID


@dataclass(frozen=True)
class CollectStep:
    held: bool
    last_id: uuid.UUID | None
    scanned: int
    digested: int


@dataclass(frozen=True)
class DigestItem:
    id: uuid.UUID
    subject: str
    body: str
    payload: dict[str, Any] | None
    priority: int
    fallback_channels: list[str]


@dataclass(frozen=True)
class Finished:
    finished: bool
    digest_id: uuid.UUID | None


@dataclass(frozen=True)
class OpenBucket:
    id: uuid.UUID
    client_id: uuid.UUID
    digest_key: str
    channel: str
    state: str
    collected: int
    closes_at: Any


class DigestRepository:
    """The close's statements (notifications/sql/digests.sql, each a function's call)."""

    def claim(
        self, *, worker: str, limit: int, claim_s: float, dead_after_s: float | None
    ) -> list[DigestClaim]:
        return QUERIES.rows(
            "notification_digests_claim",
            row=DigestClaim,
            worker=worker,
            limit=limit,
            claim_s=claim_s,
            dead_after_s=dead_after_s,
        )

    def collect(
        self, *, bucket: DigestClaim, after: uuid.UUID | None, limit: int, claim_s: float
    ) -> CollectStep:
        step = QUERIES.row(
            "notification_digest_collect",
            row=CollectStep,
            bucket=bucket.id,
            token=bucket.claim_token,
            after=after,
            limit=limit,
            claim_s=claim_s,
        )
        assert step is not None
        return step

    def digested_count(self, *, bucket: uuid.UUID) -> int:
        return QUERIES.scalar("notification_digest_count", bucket=bucket)

    def items(self, *, bucket: uuid.UUID, limit: int) -> list[DigestItem]:
        """The first `limit` rows the bucket's digest carries, in creation order."""
        return QUERIES.rows("notification_digest_items", row=DigestItem, bucket=bucket, limit=limit)

    def newest_item(self, *, bucket: uuid.UUID) -> DigestItem | None:
        return QUERIES.row("notification_digest_newest", row=DigestItem, bucket=bucket)

    def finish(
        self,
        *,
        bucket: DigestClaim,
        digested: int,
        rendered: Rendered,
        priority: int,
        payload: dict[str, Any],
        metadata: dict[str, Any],
        fallback_channels: list[str],
        max_attempts: int,
    ) -> Finished:
        found = QUERIES.row(
            "notification_digest_finish",
            row=Finished,
            bucket=bucket.id,
            token=bucket.claim_token,
            digested=digested,
            subject=rendered.subject,
            body=rendered.body,
            priority=priority,
            payload=json.dumps(payload),
            metadata=json.dumps(metadata),
            fallback_channels=json.dumps(fallback_channels),
            max_attempts=max_attempts,
        )
        assert found is not None
        return found

    def open_buckets(self, *, limit: int) -> list[OpenBucket]:
        return QUERIES.rows("notification_digests_open", row=OpenBucket, limit=limit)


def digest_items_text(lines: Sequence[str], *, total: int) -> str:
    """`{digest_items}`: one line per item shown, then "and N more" for the rest."""
    text = "\n".join(lines)
    rest = total - len(lines)
    if rest > 0:
        text = f"{text}\nand {rest} more" if text else f"and {rest} more"
    return text


def digest_render(
    template: TemplateRecord | None,
    *,
    payload: Mapping[str, Any],
    total: int,
    lines: Sequence[str],
) -> tuple[Rendered, dict[str, Any]]:
    """The digest's content and payload: `template` with `payload` and the digest's slots,
    `{digest_count}` `total` and `{digest_items}` as many of `lines` (at most
    DIGEST_ITEMS_SHOWN) as keep the rendered body within MAX_BODY_BYTES, then "and N more".
    Without a template, or one the payload no longer fills, the items themselves are the body
    (a digest is never lost to a template edited since its first notification)."""
    shown = list(lines[:DIGEST_ITEMS_SHOWN])
    while True:
        items = digest_items_text(shown, total=total)
        filled = {**payload, "digest_count": total, "digest_items": items}
        if template is None:
            break
        try:
            return template_render(template, filled), filled
        except InvalidRequest as error:
            if shown and error.message.startswith("body:"):
                shown = shown[: len(shown) // 2]
                continue
            log.warning("digest rendered without its template: %s", error.message)
            break
    while len(items.encode()) > MAX_BODY_BYTES and shown:
        shown = shown[: len(shown) // 2]
        items = digest_items_text(shown, total=total)
    filled = {**payload, "digest_count": total, "digest_items": items}
    return Rendered(subject="", body=items), filled


@dataclass
class _Closing:
    bucket: DigestClaim
    after: uuid.UUID | None = None


class DigestCloser:
    """Closes digest buckets whose window ended: a worker's upkeep (delivery/worker.py) calls
    `run_once` at each heartbeat, and at every turn of its loop while `due`. One bucket at a
    time a worker: its rows judged `batch` a statement (`notification_digest_collect`), about
    `rows_per_turn` rows (and at most 10 x rows_per_turn / batch statements) a call, then its
    digest created and the bucket CLOSED (`notification_digest_finish`). The claim lasts
    `claim_s` from each statement; a worker dead by its heartbeat (`dead_after_s`) loses it at
    once."""

    def __init__(
        self,
        *,
        worker_id: str,
        claim_s: float,
        dead_after_s: float | None,
        batch: int = 1_000,
        rows_per_turn: int = 5_000,
        max_attempts: int | None = None,
        repository: DigestRepository | None = None,
        templates: TemplateRepository | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.claim_s = claim_s
        self.dead_after_s = dead_after_s
        self.batch = batch
        self.rows_per_turn = rows_per_turn
        self.max_attempts = max_attempts
        self.repository = repository or DigestRepository()
        self.templates = templates or TemplateRepository()
        self.due = False
        self._closing: _Closing | None = None

    def run_once(self) -> int:
        """At most `rows_per_turn` rows' work; returns how many buckets it closed."""
        budget = self.rows_per_turn
        closed = 0
        while budget > 0:
            if self._closing is None:
                claimed = self.repository.claim(
                    worker=self.worker_id,
                    limit=1,
                    claim_s=self.claim_s,
                    dead_after_s=self.dead_after_s,
                )
                if not claimed:
                    self.due = False
                    return closed
                self._closing = _Closing(bucket=claimed[0])
            closing = self._closing
            step = self.repository.collect(
                bucket=closing.bucket, after=closing.after, limit=self.batch, claim_s=self.claim_s
            )
            if not step.held:
                log.warning(
                    "digest close lost its claim bucket=%s worker=%s",
                    closing.bucket.id,
                    self.worker_id,
                )
                self._closing = None
                continue
            if step.scanned < self.batch:  # the bucket's last rows: nothing after them
                self._closing = None
                closed += self._finish(closing.bucket)
                continue
            closing.after = step.last_id
            # Charged the rows it ended, and at least a tenth of a batch: at most
            # 10 x rows_per_turn / batch statements a turn, however few rows each ends.
            budget -= max(step.digested, self.batch // 10, 1)
        self.due = True
        return closed

    def _finish(self, bucket: DigestClaim) -> int:
        total = self.repository.digested_count(bucket=bucket.id)
        newest = self.repository.newest_item(bucket=bucket.id) if total else None
        if newest is None:
            rendered, payload = Rendered(subject="", body=""), {}
            priority, fallbacks = 0, []
        else:
            lines = [
                digest_item_line(subject=item.subject, body=item.body)
                for item in self.repository.items(bucket=bucket.id, limit=DIGEST_ITEMS_SHOWN)
            ]
            template = self.templates.get(
                client_id=bucket.client_id, event=bucket.template, channel=bucket.channel
            )
            rendered, payload = digest_render(
                template, payload=newest.payload or {}, total=total, lines=lines
            )
            priority, fallbacks = newest.priority, newest.fallback_channels
        finished = self.repository.finish(
            bucket=bucket,
            digested=total,
            rendered=rendered,
            priority=priority,
            payload=payload,
            metadata={"digest_key": bucket.digest_key, "digest_count": total},
            fallback_channels=fallbacks,
            max_attempts=self.max_attempts or settings.NOTIFYQUEUE_MAX_ATTEMPTS,
        )
        if not finished.finished:
            log.warning(
                "digest close found its bucket changed bucket=%s worker=%s",
                bucket.id,
                self.worker_id,
            )
            return 0
        metrics.digest_closed(channel=bucket.channel, digested=total)
        log.info(
            "digest closed bucket=%s client=%s channel=%s digested=%d digest=%s worker=%s",
            bucket.id,
            bucket.client_id,
            bucket.channel,
            total,
            finished.digest_id,
            self.worker_id,
        )
        return 1
