"""Rules for creating, reading, listing and cancelling notifications. No ORM here.

Invariants protected here:
- a request is fully checked (content resolved, body size) before anything is written, so an
  invalid one never enters the queue;
- new (201), replay (200) or reused key (409) is decided by the repository's unique constraint
  and the sha256 fingerprint of the normalised request, never by a read that could race;
- a stored body is at most 64 KiB of UTF-8 after rendering;
- a client whose PENDING backlog is over its limit cannot create (429), but can still replay;
  the figure is a per-process cache (`ClientBacklog`), recounted at most every
  `BACKLOG_RECOUNT_S` seconds, so a create never counts the backlog itself;
- send and due times are decided by the database clock when the row is inserted, never by
  this process's clock;
- only the owner can cancel, and only a PENDING notification;
- retention (`notifications_prune_step`) deletes only finished rows, never one still waiting
  or whose webhook is still being delivered, and never inside a rate-limit window;
- only FAILED and DEAD_LETTERED notifications can be retried, each retry is one guarded write
  that starts the attempts again at 0 and records who retried it and when; a bulk retry takes
  at most one batch, oldest first, and never sends one row back twice in one round.

Every state change made here is logged as one `key=value` line (logger
`notifyqueue.notifications`) naming the notification, client, channel, attempt and outcome.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from django.conf import settings
from rest_framework import status as http

from monitoring import metrics
from notifications.models import Priority, Status
from notifications.repositories import (
    DuplicateRequest,
    Inserted,
    ListFilters,
    ListPage,
    ListPosition,
    NewNotification,
    NotificationRecord,
    NotificationRepository,
    PruneStep,
    RetriedRow,
)
from notifyqueue.errors import Conflict, DomainError, InvalidRequest, NotFound
from notifyqueue.vocabulary import MAX_BODY_BYTES
from preferences.services import RenderedContent
from templates.services import UnknownTemplate

IDEMPOTENCY_KEY_MAX_LENGTH = 255
# How long a client over its backlog limit is told to wait: long enough for workers to drain a
# meaningful share, short enough that a briefly full queue does not stall the client.
BACKLOG_RETRY_AFTER_S = 30
# How stale the backlog figure a create checks may be. Between counts a process adds its own
# creates to the figure, so it alone never overshoots; all processes together can overshoot
# the limit by what they create in this long (workers' sends are subtracted at the next count).
BACKLOG_RECOUNT_S = 2.0
# The count is bounded by the limit, yet at a large limit it takes a while: it is never run
# more often than this share of the time it takes (1/50: at most 2 % of a process's time).
BACKLOG_COUNT_SHARE = 50
PAGE_SIZE_DEFAULT = 50
PAGE_SIZE_MAX = 200
RETRYABLE_STATUSES = (Status.FAILED, Status.DEAD_LETTERED)
# One bulk retry call sends back at most this many: each call is one short UPDATE, and a
# recovered provider does not get the whole dead-letter queue in one burst.
BULK_RETRY_LIMIT = 1000
BULK_RETRY_LIMIT_MAX = 10_000
# Retention: rows scanned per batch. Each batch is one short statement; its locks last only as
# long as that batch's deletes.
PRUNE_BATCH = 1000
PRUNE_BATCH_MAX = 10_000

log = logging.getLogger("notifyqueue.notifications")


class IdempotencyKeyReused(Conflict):
    code = "idempotency_key_reused"


class NotificationNotFound(NotFound):
    def __init__(self, notification_id: uuid.UUID | str) -> None:
        super().__init__(f"No notification {notification_id}.")


class NotificationNotCancellable(Conflict):
    code = "not_cancellable"


class NotificationNotRetryable(Conflict):
    code = "not_retryable"


class TooManyPending(DomainError):
    code = "too_many_pending"
    http_status = http.HTTP_429_TOO_MANY_REQUESTS

    def __init__(self, *, limit: int) -> None:
        super().__init__(
            f"More than {limit} of your notifications are waiting to be sent; "
            f"retry in {BACKLOG_RETRY_AFTER_S} seconds."
        )
        self.headers = {"Retry-After": str(BACKLOG_RETRY_AFTER_S)}


@dataclass(frozen=True)
class NotificationRequest:
    """A create request after shape validation: names canonical, times timezone-aware."""

    channel: str | None
    recipient: str | None
    subject: str = ""
    body: str | None = None
    priority: Priority = Priority.NORMAL
    send_at: datetime | None = None
    delay_seconds: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    template: str | None = None
    payload: dict[str, Any] | None = None
    user_id: str | None = None


class TemplateRenderer(Protocol):
    def render(self, *, client_id: uuid.UUID, request: NotificationRequest) -> RenderedContent:
        """Renders `request.template` with `request.payload`, or raises a DomainError."""


class NoTemplates:
    """The renderer when none is given: every template name is unknown. The API passes
    `preferences.services.NotificationContent`, which renders real templates."""

    def render(self, *, client_id: uuid.UUID, request: NotificationRequest) -> RenderedContent:
        raise UnknownTemplate(event=request.template or "", channel=request.channel)


class NotificationStore(Protocol):
    """What the services need from storage; `NotificationRepository` is the real one."""

    def insert(self, *, new: NewNotification) -> NotificationRecord: ...

    def insert_many(
        self, *, client_id: uuid.UUID, new: Sequence[NewNotification]
    ) -> list[Inserted]: ...

    def get(
        self, *, notification_id: uuid.UUID, client_id: uuid.UUID | None
    ) -> NotificationRecord | None: ...

    def get_by_idempotency_key(
        self, *, client_id: uuid.UUID, idempotency_key: str
    ) -> NotificationRecord | None: ...

    def list_page(
        self,
        *,
        client_id: uuid.UUID | None,
        filters: ListFilters,
        after: ListPosition | None,
        before: ListPosition | None,
        limit: int,
    ) -> ListPage: ...

    def cancel_pending(
        self, *, notification_id: uuid.UUID, client_id: uuid.UUID, now: datetime
    ) -> NotificationRecord | None: ...

    def pending_count(self, *, client_id: uuid.UUID, limit: int) -> int: ...

    def retry_one(
        self, *, notification_id: uuid.UUID, operator: str, now: datetime
    ) -> NotificationRecord | None: ...

    def retry_oldest(
        self,
        *,
        status: str,
        channel: str | None,
        limit: int,
        operator: str,
        now: datetime,
        retried_before: datetime | None = None,
    ) -> list[RetriedRow]: ...

    def retryable_count(
        self, *, status: str, channel: str | None, retried_before: datetime | None = None
    ) -> int: ...

    def prune_cutoff(self, *, older_than_s: float) -> datetime: ...

    def prune_batch(self, *, cutoff: datetime, after: ListPosition, scan: int) -> PruneStep: ...


@dataclass(frozen=True)
class CreateResult:
    notification: NotificationRecord
    # False when the request replayed an earlier one with the same key (HTTP 200, not 201).
    created: bool


@dataclass(frozen=True)
class BatchItem:
    idempotency_key: str
    request: NotificationRequest


@dataclass(frozen=True)
class BatchOutcome:
    http_status: int
    notification: NotificationRecord | None = None
    error: DomainError | None = None


@dataclass(frozen=True)
class BulkRetryResult:
    retried: int
    # Rows still in that status (and channel) that a further call would retry.
    remaining: int


@dataclass(frozen=True)
class NotificationListPage:
    notifications: list[NotificationRecord]
    next_cursor: str | None
    previous_cursor: str | None


def idempotency_key_problem(key: str | None) -> str | None:
    """Why `key` cannot be an idempotency key, or None when it can."""
    if key is None or key == "":
        return "An idempotency key is required."
    if len(key) > IDEMPOTENCY_KEY_MAX_LENGTH:
        return f"At most {IDEMPOTENCY_KEY_MAX_LENGTH} characters."
    if not all(" " <= char <= "~" for char in key) or not key.strip():
        return "Only printable ASCII characters, and not only spaces."
    return None


def notification_request_fingerprint(request: NotificationRequest) -> str:
    """sha256 of the normalised request: equal for a replay, different for any changed field.

    `delay_seconds` is kept as sent (not turned into a time), so a replay a minute later of
    "in 60 seconds" is still the same request.
    """
    canonical = {
        "channel": request.channel,
        "recipient": request.recipient,
        "subject": request.subject,
        "body": request.body,
        "priority": request.priority.name,
        "send_at": None if request.send_at is None else request.send_at.astimezone(UTC).isoformat(),
        "delay_seconds": request.delay_seconds,
        "metadata": request.metadata,
        "template": request.template,
        "payload": request.payload,
        "user_id": request.user_id,
    }
    encoded = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(encoded.encode()).hexdigest()


class ClientBacklog:
    """Each client's PENDING backlog as this process last counted it, plus what this process
    created since. Thread-safe; one per process (`CLIENT_BACKLOG`), or one per test."""

    @dataclass
    class _Figure:
        limit: int
        counted: int
        created_since: int
        recount_at: float

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._figures: dict[uuid.UUID, ClientBacklog._Figure] = {}
        self._lock = threading.Lock()

    def check(self, *, client_id: uuid.UUID, limit: int, repository: NotificationStore) -> None:
        """Raises TooManyPending when more than `limit` of the client's notifications are
        PENDING, as far as the figure knows."""
        now = self._clock()
        with self._lock:
            figure = self._figures.get(client_id)
            fresh = figure is not None and figure.limit == limit and now < figure.recount_at
            pending = figure.counted + figure.created_since if fresh else None
        if pending is None:
            counted = repository.pending_count(client_id=client_id, limit=limit + 1)
            took = self._clock() - now
            recount_at = now + max(BACKLOG_RECOUNT_S, took * BACKLOG_COUNT_SHARE)
            with self._lock:
                self._figures[client_id] = self._Figure(limit, counted, 0, recount_at)
            pending = counted
        if pending > limit:
            raise TooManyPending(limit=limit)

    def created(self, *, client_id: uuid.UUID, count: int) -> None:
        """Adds this process's new rows to the client's figure until the next count."""
        with self._lock:
            figure = self._figures.get(client_id)
            if figure is not None:
                figure.created_since += count


CLIENT_BACKLOG = ClientBacklog()


def notification_create(
    *,
    client_id: uuid.UUID,
    idempotency_key: str,
    request: NotificationRequest,
    repository: NotificationStore | None = None,
    renderer: TemplateRenderer | None = None,
    max_pending: int | None = None,
    max_attempts: int | None = None,
    backlog: ClientBacklog | None = None,
) -> CreateResult:
    """Creates the notification, or answers with the one this key already created.

    The common case is one statement: the insert, or the row already holding the key.
    """
    repository = repository or NotificationRepository()
    backlog = backlog or CLIENT_BACKLOG
    limit = settings.NOTIFYQUEUE_CLIENT_MAX_PENDING if max_pending is None else max_pending
    attempts = settings.NOTIFYQUEUE_MAX_ATTEMPTS if max_attempts is None else max_attempts
    try:
        new = _notification_prepare(
            client_id=client_id,
            idempotency_key=idempotency_key,
            request=request,
            renderer=renderer or NoTemplates(),
            max_attempts=attempts,
        )
        backlog.check(client_id=client_id, limit=limit, repository=repository)
    except DomainError:
        # A replay is answered even when the backlog is full, and even when the template or
        # the user's preferences changed since: it answers as the first request did.
        result = _replay_if_known(
            client_id=client_id,
            idempotency_key=idempotency_key,
            request=request,
            repository=repository,
        )
        if result is None:
            raise
        return result
    result = _insert(new=new, repository=repository)
    if result.created:
        backlog.created(client_id=client_id, count=1)
    return result


def notification_batch_create(
    *,
    client_id: uuid.UUID,
    items: Sequence[BatchItem | InvalidRequest],
    repository: NotificationStore | None = None,
    renderer: TemplateRenderer | None = None,
    max_pending: int | None = None,
    max_attempts: int | None = None,
    backlog: ClientBacklog | None = None,
) -> list[BatchOutcome]:
    """Creates each item independently; items that failed validation answer 400. The answer
    is what each item would have got as a single create, in order, as if sent one by one.

    Every item that can be inserted is inserted by one statement. The backlog is checked once
    for the whole batch (429 for all of it), so a batch can take a client at most one batch
    past its limit.
    """
    repository = repository or NotificationRepository()
    renderer = renderer or NoTemplates()
    backlog = backlog or CLIENT_BACKLOG
    limit = settings.NOTIFYQUEUE_CLIENT_MAX_PENDING if max_pending is None else max_pending
    attempts = settings.NOTIFYQUEUE_MAX_ATTEMPTS if max_attempts is None else max_attempts
    backlog.check(client_id=client_id, limit=limit, repository=repository)
    outcomes: list[BatchOutcome | None] = [None] * len(items)
    to_insert: dict[str, tuple[int, NewNotification]] = {}
    # A key that an earlier item of this batch inserts: answered as a replay of that row.
    repeats: list[tuple[int, BatchItem]] = []
    for index, item in enumerate(items):
        if isinstance(item, InvalidRequest):
            outcomes[index] = BatchOutcome(http_status=item.http_status, error=item)
            continue
        if item.idempotency_key in to_insert:
            repeats.append((index, item))
            continue
        try:
            new = _notification_prepare(
                client_id=client_id,
                idempotency_key=item.idempotency_key,
                request=item.request,
                renderer=renderer,
                max_attempts=attempts,
            )
        except DomainError as error:
            # The key may already hold this request from before the template or the
            # preferences changed: a replay answers as the first request did.
            existing = repository.get_by_idempotency_key(
                client_id=client_id, idempotency_key=item.idempotency_key
            )
            outcomes[index] = (
                BatchOutcome(http_status=error.http_status, error=error)
                if existing is None
                else _batch_replay(existing=existing, request=item.request)
            )
            continue
        to_insert[item.idempotency_key] = (index, new)
    inserted = repository.insert_many(
        client_id=client_id, new=[new for _, new in to_insert.values()]
    )
    holders: dict[str, NotificationRecord] = {}
    created = 0
    for (index, new), result in zip(to_insert.values(), inserted, strict=True):
        holders[new.idempotency_key] = result.record
        if result.created:
            created += 1
            metrics.notification_created(channel=result.record.channel)
            outcomes[index] = BatchOutcome(
                http_status=http.HTTP_201_CREATED, notification=result.record
            )
        else:
            outcomes[index] = _batch_replay(existing=result.record, request=items[index].request)
    for index, item in repeats:
        holder = holders[item.idempotency_key]
        outcomes[index] = _batch_replay(existing=holder, request=item.request)
    backlog.created(client_id=client_id, count=created)
    return [outcome for outcome in outcomes if outcome is not None]


def _batch_replay(*, existing: NotificationRecord, request: NotificationRequest) -> BatchOutcome:
    """A batch item whose key `existing` holds: 200 for the same request, 409 otherwise."""
    try:
        result = _replay(existing=existing, fingerprint=notification_request_fingerprint(request))
    except IdempotencyKeyReused as error:
        return BatchOutcome(http_status=error.http_status, error=error)
    return BatchOutcome(http_status=http.HTTP_200_OK, notification=result.notification)


def _replay_if_known(
    *,
    client_id: uuid.UUID,
    idempotency_key: str,
    request: NotificationRequest,
    repository: NotificationStore,
) -> CreateResult | None:
    """The answer to a replay of `request` if the key is already used, else None."""
    existing = repository.get_by_idempotency_key(
        client_id=client_id, idempotency_key=idempotency_key
    )
    if existing is None:
        return None
    return _replay(existing=existing, fingerprint=notification_request_fingerprint(request))


def notification_get(
    *,
    notification_id: uuid.UUID,
    client_id: uuid.UUID,
    is_operator: bool,
    repository: NotificationStore | None = None,
) -> NotificationRecord:
    """The notification, if the client owns it (an operator may read any)."""
    repository = repository or NotificationRepository()
    found = repository.get(
        notification_id=notification_id, client_id=None if is_operator else client_id
    )
    if found is None:
        raise NotificationNotFound(notification_id)
    return found


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


def notification_cancel(
    *,
    notification_id: uuid.UUID,
    client_id: uuid.UUID,
    now: datetime,
    repository: NotificationStore | None = None,
) -> NotificationRecord:
    """Cancels the client's PENDING notification; 409 for any other status, 404 if not theirs."""
    repository = repository or NotificationRepository()
    cancelled = repository.cancel_pending(
        notification_id=notification_id, client_id=client_id, now=now
    )
    if cancelled is not None:
        log.info(
            "notification cancelled notification=%s client=%s channel=%s attempt=%d "
            "outcome=CANCELLED status=%s",
            cancelled.id,
            cancelled.client_id,
            cancelled.channel,
            cancelled.attempt_count,
            cancelled.status,
        )
        return cancelled
    current = repository.get(notification_id=notification_id, client_id=client_id)
    if current is None:
        raise NotificationNotFound(notification_id)
    raise NotificationNotCancellable(
        f"Only a PENDING notification can be cancelled; this one is {current.status}.",
        fields={"status": [current.status]},
    )


def notification_retry(
    *,
    notification_id: uuid.UUID,
    operator: str,
    now: datetime,
    repository: NotificationStore | None = None,
) -> NotificationRecord:
    """Sends a FAILED or DEAD_LETTERED notification (any client's) back to PENDING, due now,
    with its attempts at 0; 409 for any other status, 404 if there is no such notification.

    `operator` names who asked (recorded on the row): e.g. `api:<client>`, `admin:<user>`.
    """
    repository = repository or NotificationRepository()
    retried = repository.retry_one(notification_id=notification_id, operator=operator, now=now)
    if retried is not None:
        _log_retried(
            notification_id=retried.id,
            client_id=retried.client_id,
            channel=retried.channel,
            operator_retries=retried.operator_retries,
            operator=operator,
        )
        return retried
    current = repository.get(notification_id=notification_id, client_id=None)
    if current is None:
        raise NotificationNotFound(notification_id)
    raise NotificationNotRetryable(
        f"Only a FAILED or DEAD_LETTERED notification can be retried; this one is "
        f"{current.status}.",
        fields={"status": [current.status]},
    )


def notifications_retry_bulk(
    *,
    status: str,
    operator: str,
    now: datetime,
    channel: str | None = None,
    limit: int = BULK_RETRY_LIMIT,
    retried_before: datetime | None = None,
    repository: NotificationStore | None = None,
) -> BulkRetryResult:
    """Retries up to `limit` of the oldest notifications in `status` (FAILED or DEAD_LETTERED),
    optionally on one channel, and says how many are left.

    Rows another operator's retry holds locked are skipped, not waited for. With
    `retried_before`, rows retried at or after that moment are left alone, so a loop over
    batches (the command) ends even if a retried row fails again while it runs.
    """
    repository = repository or NotificationRepository()
    if status not in RETRYABLE_STATUSES:
        message = "Only FAILED or DEAD_LETTERED notifications can be retried."
        raise InvalidRequest(f"status: {message}", fields={"status": [message]})
    if not 1 <= limit <= BULK_RETRY_LIMIT_MAX:
        message = f"Between 1 and {BULK_RETRY_LIMIT_MAX}."
        raise InvalidRequest(f"limit: {message}", fields={"limit": [message]})
    retried = repository.retry_oldest(
        status=status,
        channel=channel,
        limit=limit,
        operator=operator,
        now=now,
        retried_before=retried_before,
    )
    for row in retried:
        _log_retried(
            notification_id=row.id,
            client_id=row.client_id,
            channel=row.channel,
            operator_retries=row.operator_retries,
            operator=operator,
        )
    remaining = repository.retryable_count(
        status=status, channel=channel, retried_before=retried_before
    )
    return BulkRetryResult(retried=len(retried), remaining=remaining)


def notifications_prune_cutoff(
    *, older_than_s: float, repository: NotificationStore | None = None
) -> datetime:
    """The moment before which finished notifications may go: the database clock minus
    `older_than_s`, which may not be shorter than the rate-limit window (the window counts
    the records that retention deletes with their notifications)."""
    repository = repository or NotificationRepository()
    window_s = settings.NOTIFYQUEUE_RATE_LIMIT_WINDOW_SECONDS
    if older_than_s < window_s:
        message = f"At least the rate-limit window ({window_s:g} seconds)."
        raise InvalidRequest(f"older_than: {message}", fields={"older_than": [message]})
    return repository.prune_cutoff(older_than_s=older_than_s)


def notifications_prune_step(
    *,
    cutoff: datetime,
    after: ListPosition,
    batch: int = PRUNE_BATCH,
    repository: NotificationStore | None = None,
) -> PruneStep:
    """One retention batch: of the next `batch` notifications created before `cutoff` (after
    `after`), deletes those that finished before it, with their attempts, webhook events,
    inbox messages and rate-limit records. Call again from the returned position until it
    scans nothing."""
    repository = repository or NotificationRepository()
    if not 1 <= batch <= PRUNE_BATCH_MAX:
        message = f"Between 1 and {PRUNE_BATCH_MAX}."
        raise InvalidRequest(f"batch: {message}", fields={"batch": [message]})
    step = repository.prune_batch(cutoff=cutoff, after=after, scan=batch)
    if step.deleted:
        log.info(
            "notifications pruned count=%d attempts=%d cutoff=%s",
            step.deleted,
            step.attempts_deleted,
            cutoff.isoformat(),
        )
    return step


def _log_retried(
    *,
    notification_id: uuid.UUID,
    client_id: uuid.UUID,
    channel: str,
    operator_retries: int,
    operator: str,
) -> None:
    metrics.notification_retried(channel=channel)
    log.info(
        "notification retried notification=%s client=%s channel=%s attempt=0 "
        "outcome=RETRIED status=PENDING operator_retries=%d operator=%s",
        notification_id,
        client_id,
        channel,
        operator_retries,
        operator,
    )


def _notification_prepare(
    *,
    client_id: uuid.UUID,
    idempotency_key: str,
    request: NotificationRequest,
    renderer: TemplateRenderer,
    max_attempts: int,
) -> NewNotification:
    if request.template is not None:
        content = renderer.render(client_id=client_id, request=request)
    else:
        content = RenderedContent(
            channel=request.channel or "",
            recipient=request.recipient or "",
            subject=request.subject,
            body=request.body or "",
        )
    size = len(content.body.encode("utf-8"))
    if size > MAX_BODY_BYTES:
        raise InvalidRequest(
            f"body: {size} bytes of UTF-8; at most {MAX_BODY_BYTES} are allowed.",
            fields={"body": [f"At most {MAX_BODY_BYTES} bytes of UTF-8 (this one is {size})."]},
        )
    return NewNotification(
        client_id=client_id,
        idempotency_key=idempotency_key,
        request_fingerprint=notification_request_fingerprint(request),
        channel=content.channel,
        recipient=content.recipient,
        subject=content.subject,
        body=content.body,
        priority=request.priority,
        metadata=request.metadata,
        user_id=request.user_id,
        template=request.template,
        payload=request.payload,
        fallback_channels=content.fallback_channels,
        max_attempts=max_attempts,
        send_at=request.send_at,
        delay_seconds=request.delay_seconds,
    )


def _insert(*, new: NewNotification, repository: NotificationStore) -> CreateResult:
    try:
        inserted = repository.insert(new=new)
    except DuplicateRequest as duplicate:
        return _replay(existing=duplicate.existing, fingerprint=new.request_fingerprint)
    metrics.notification_created(channel=inserted.channel)
    return CreateResult(notification=inserted, created=True)


def _replay(*, existing: NotificationRecord, fingerprint: str) -> CreateResult:
    if existing.request_fingerprint != fingerprint:
        raise IdempotencyKeyReused(
            f"Idempotency key {existing.idempotency_key!r} was already used for a different "
            f"request (notification {existing.id}).",
            fields={"idempotency_key": ["Already used for a different request."]},
        )
    return CreateResult(notification=existing, created=False)


def _cursor_encode(direction: str, record: NotificationRecord) -> str:
    position = {"d": direction, "t": record.created_at.isoformat(), "i": str(record.id)}
    return base64.urlsafe_b64encode(json.dumps(position).encode()).decode().rstrip("=")


def _cursor_decode(cursor: str) -> tuple[str, ListPosition]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        position = json.loads(base64.urlsafe_b64decode(padded.encode()))
        direction = position["d"]
        created_at = datetime.fromisoformat(position["t"])
        if direction not in {"next", "previous"} or created_at.tzinfo is None:
            raise ValueError(direction)
        return direction, ListPosition(created_at=created_at, id=uuid.UUID(position["i"]))
    except (binascii.Error, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        message = "Not a cursor this API returned."
        raise InvalidRequest(f"cursor: {message}", fields={"cursor": [message]}) from exc
