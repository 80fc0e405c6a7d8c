"""Rules for creating, reading and cancelling notifications. No ORM here.

Listing with its cursor is in `notifications/listing.py`, operator retries in
`notifications/retries.py`; they share `NotificationStore` and the errors defined here.
Retention deletes every app's rows of a notification, so it is the delivery app's
(`delivery/retention.py`).

Invariants protected here:
- a request is fully checked (content resolved, body size) before anything is written, so an
  invalid one never enters the queue;
- new (201), replay (200) or reused key (409) is decided by the repository's unique constraint
  and the sha256 fingerprint of the normalised request, never by a read that could race;
- a create whose API key is not yet confirmed in its request (`UnconfirmedKey`) reads and
  answers nothing of the client's until the key is: by the insert that checks it, or by a
  lookup;
- a stored body is at most 64 KiB of UTF-8 after rendering;
- a client whose PENDING backlog is over its limit cannot create (429), but can still replay;
  the figure is a per-process cache (`ClientBacklog`), recounted at most every
  `BACKLOG_RECOUNT_S` seconds, so a create never counts the backlog itself;
- send and due times are decided by the database clock when the row is inserted, never by
  this process's clock;
- only the owner can cancel: one notification only while PENDING; by cancellation key, every
  one of the client's with that key whose send has not started (a claimed one too), and the
  answer comes only once all of them are CANCELLED;
- an expiry is later than the send time by the database clock (`notification_expiry_check`).

Every state change made here is logged as one `key=value` line (logger
`notifyqueue.notifications`) naming the notification, client, channel, attempt and outcome.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from django.conf import settings
from rest_framework import status as http

from monitoring import metrics
from notifications.digests import digest_item_line
from notifications.models import Priority
from notifications.repositories import (
    CANCEL_BATCH,
    CancelNotFinished,
    DuplicateRequest,
    Inserted,
    KeyCheck,
    KeyCheckFailed,
    ListFilters,
    ListPage,
    ListPosition,
    NewNotification,
    NotificationRecord,
    NotificationRepository,
    RetriedRow,
)
from notifyqueue.errors import Conflict, DomainError, InvalidRequest, NotFound
from notifyqueue.vocabulary import MAX_BODY_BYTES
from preferences.routing import RenderedContent
from templates.models import SUBJECT_MAX_LENGTH
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

log = logging.getLogger("notifyqueue.notifications")


class IdempotencyKeyReused(Conflict):
    code = "idempotency_key_reused"


class NotificationNotFound(NotFound):
    def __init__(self, notification_id: uuid.UUID | str) -> None:
        super().__init__(f"No notification {notification_id}.")


class NotificationNotCancellable(Conflict):
    code = "not_cancellable"


class TooManyPending(DomainError):
    code = "too_many_pending"
    http_status = http.HTTP_429_TOO_MANY_REQUESTS

    def __init__(self, *, limit: int) -> None:
        super().__init__(
            f"More than {limit} of your notifications are waiting to be sent; "
            f"retry in {BACKLOG_RETRY_AFTER_S} seconds."
        )
        self.headers = {"Retry-After": str(BACKLOG_RETRY_AFTER_S)}


@dataclass(slots=True)
class NotificationRequest:
    """A create request after shape validation: names canonical, times timezone-aware. Not
    frozen, as the create path's other values (notifications/repositories.py)."""

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
    # Not sent by then, it ends EXPIRED: a time, or seconds after the send time.
    expires_at: datetime | None = None
    ttl_seconds: int | None = None
    cancellation_key: str | None = None
    # Collect into a digest (notifications/digests.py): the key, and the window's length or
    # the local time of day it closes at.
    digest_key: str | None = None
    digest_window_seconds: int | None = None
    digest_at: str | None = None


class ExpiresBeforeSend(InvalidRequest):
    code = "expires_before_send"

    def __init__(self) -> None:
        message = "expires_at must be later than the send time (send_at, delay_seconds or now)."
        super().__init__(message, fields={"expires_at": [message]})


class TemplateRenderer(Protocol):
    def render(self, *, client_id: uuid.UUID, request: NotificationRequest) -> RenderedContent:
        """Renders `request.template` with `request.payload`, or raises a DomainError."""


class UnconfirmedKey(Protocol):
    """The request's API key as this process authenticated it before (the thin create path's
    remembered key), not yet looked up in this request: the create statement checks that it is
    still usable (`check`). Where that statement cannot tell (it inserted nothing) or is not
    sent (a refusal before it), `confirm` looks the key up and raises the API's 401 when it is
    no longer usable."""

    @property
    def check(self) -> KeyCheck: ...

    def confirm(self) -> None: ...


class CriticalNotAllowed(InvalidRequest):
    """CRITICAL from a client without the permission. An InvalidRequest so that a batch item
    carries it like any other refused item; the answer is 403, not 400."""

    code = "critical_not_allowed"
    http_status = http.HTTP_403_FORBIDDEN

    def __init__(self) -> None:
        message = (
            "Your client may not send CRITICAL notifications; an operator can allow it "
            "(admin, or create_client --critical)."
        )
        super().__init__(message, fields={"priority": [message]})


def notification_priority_check(*, priority: Priority | None, may_send_critical: bool) -> None:
    """Raises CriticalNotAllowed for CRITICAL from a client without the permission: CRITICAL
    goes before every other client's work and skips the rate limit."""
    if priority == Priority.CRITICAL and not may_send_critical:
        raise CriticalNotAllowed()


class NoTemplates:
    """The renderer when none is given: every template name is unknown. The API passes
    `preferences.routing.NotificationContent`, which renders real templates."""

    def render(self, *, client_id: uuid.UUID, request: NotificationRequest) -> RenderedContent:
        raise UnknownTemplate(event=request.template or "", channel=request.channel)


class NotificationStore(Protocol):
    """What the services need from storage; `NotificationRepository` is the real one."""

    def insert(
        self, *, new: NewNotification, key_check: KeyCheck | None = None
    ) -> NotificationRecord: ...

    def insert_many(
        self, *, client_id: uuid.UUID, new: Sequence[NewNotification]
    ) -> list[Inserted]: ...

    def insert_digest(self, *, new: NewNotification) -> Inserted: ...

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

    def database_now(self) -> datetime: ...

    def cancel_by_key(self, *, client_id: uuid.UUID, cancellation_key: str, batch: int) -> int: ...

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


def idempotency_key_problem(key: str | None) -> str | None:
    """Why `key` cannot be an idempotency key, or None when it can."""
    if key is None or key == "":
        return "An idempotency key is required."
    if len(key) > IDEMPOTENCY_KEY_MAX_LENGTH:
        return f"At most {IDEMPOTENCY_KEY_MAX_LENGTH} characters."
    # Printable ASCII is " " to "~": isascii() and isprintable() say it in C, per key rather
    # than per character (a batch checks a thousand keys).
    if not (key.isascii() and key.isprintable()) or not key.strip():
        return "Only printable ASCII characters, and not only spaces."
    return None


# The fingerprint's JSON, made once: json.dumps() with options builds an encoder per call, a
# fifth of a fingerprint's cost (a batch computes a thousand).
_CANONICAL_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


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
    # Named only when given, so the fingerprint of a request without them is what it was
    # before they existed: a replay of an older request still answers 200.
    if request.expires_at is not None:
        canonical["expires_at"] = request.expires_at.astimezone(UTC).isoformat()
    if request.ttl_seconds is not None:
        canonical["ttl_seconds"] = request.ttl_seconds
    if request.cancellation_key is not None:
        canonical["cancellation_key"] = request.cancellation_key
    if request.digest_key is not None:
        canonical["digest_key"] = request.digest_key
        canonical["digest_window_seconds"] = request.digest_window_seconds
        canonical["digest_at"] = request.digest_at
    return hashlib.sha256(_CANONICAL_JSON.encode(canonical).encode()).hexdigest()


class ClientBacklog:
    """Each client's PENDING backlog as this process last counted it, plus what this process
    created since. Thread-safe; one per process (`CLIENT_BACKLOG`), or one per test.

    One thread of the process recounts a figure that has aged; the others go on checking
    against the figure they have meanwhile, instead of each counting too: at a large limit a
    count takes a while (400 ms at 1,000,000 waiting), and every thread of a busy process
    arrived at the same expiry and counted at once.
    Only a process that has no figure for the client yet (or one for another limit) makes
    each thread count."""

    @dataclass
    class _Figure:
        limit: int
        counted: int
        created_since: int
        recount_at: float
        recounting: bool = False

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
            if figure is None or figure.limit != limit:
                pending, aged = None, None
            else:
                pending = figure.counted + figure.created_since
                aged = figure if now >= figure.recount_at and not figure.recounting else None
                if aged is not None:
                    aged.recounting = True
        if pending is None or aged is not None:
            try:
                counted = repository.pending_count(client_id=client_id, limit=limit + 1)
            except BaseException:
                if aged is not None:  # the next create recounts (a count replaces the figure)
                    with self._lock:
                        aged.recounting = False
                raise
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
    unconfirmed_key: UnconfirmedKey | None = None,
) -> CreateResult:
    """Creates the notification, or answers with the one this key already created.

    The common case is one statement: the insert, or the row already holding the key. With
    `unconfirmed_key` (an API key not yet looked up in this request), that statement also
    checks the key; nothing of the client's is read or answered before the key is known
    usable: by that statement's insert, or else by `unconfirmed_key.confirm()`, which raises
    when it is not (and then the create goes on as one whose key was looked up).
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
        if request.expires_at is not None:
            notification_expiry_check(request, now=repository.database_now())
        backlog.check(client_id=client_id, limit=limit, repository=repository)
    except DomainError:
        if unconfirmed_key is not None:
            unconfirmed_key.confirm()
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
    if new.digest_key is not None:
        # The digest create checks no API key itself: the key is looked up first.
        if unconfirmed_key is not None:
            unconfirmed_key.confirm()
        result = _insert_digest(new=new, repository=repository)
    elif unconfirmed_key is None:
        result = _insert(new=new, repository=repository)
    else:
        result = _insert_key_checked(new=new, repository=repository, key=unconfirmed_key)
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
    # One reading of the database clock for every item with an expiry time.
    database_now = None
    if any(isinstance(item, BatchItem) and item.request.expires_at for item in items):
        database_now = repository.database_now()
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
            if database_now is not None and item.request.expires_at is not None:
                notification_expiry_check(item.request, now=database_now)
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
    # Items with a digest key are each one statement (`insert_digest`), the others one for all.
    plain = [(index, new) for index, new in to_insert.values() if new.digest_key is None]
    digests = [(index, new) for index, new in to_insert.values() if new.digest_key is not None]
    inserted = repository.insert_many(client_id=client_id, new=[new for _, new in plain])
    inserted += [repository.insert_digest(new=new) for _, new in digests]
    holders: dict[str, NotificationRecord] = {}
    # Counted per channel, one update of each series a batch (each takes a lock).
    created_by_channel: Counter[str] = Counter()
    for (index, new), result in zip(plain + digests, inserted, strict=True):
        holders[new.idempotency_key] = result.record
        if result.created:
            created_by_channel[result.record.channel] += 1
            outcomes[index] = BatchOutcome(
                http_status=http.HTTP_201_CREATED, notification=result.record
            )
        else:
            outcomes[index] = _batch_replay(existing=result.record, request=items[index].request)
    for index, item in repeats:
        holder = holders[item.idempotency_key]
        outcomes[index] = _batch_replay(existing=holder, request=item.request)
    for channel, count in created_by_channel.items():
        metrics.notification_created(channel=channel, count=count)
    _digest_collected_count([result for result in inserted[len(plain) :] if result.created])
    backlog.created(client_id=client_id, count=created_by_channel.total())
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
        metrics.notifications_cancelled(count=1, how="id")
        return cancelled
    current = repository.get(notification_id=notification_id, client_id=client_id)
    if current is None:
        raise NotificationNotFound(notification_id)
    raise NotificationNotCancellable(
        f"Only a PENDING notification can be cancelled; this one is {current.status}.",
        fields={"status": [current.status]},
    )


def notification_expiry_check(request: NotificationRequest, *, now: datetime) -> None:
    """Raises ExpiresBeforeSend when `request.expires_at` is not later than its send time by
    the database clock `now` (`send_at`, a past one meaning now; or `delay_seconds` from now).
    A time to live counts from the send time, so it never precedes it."""
    if request.expires_at is None:
        return
    if request.delay_seconds is not None:
        send_time = now + timedelta(seconds=request.delay_seconds)
    else:
        send_time = max(request.send_at or now, now)
    if request.expires_at <= send_time:
        raise ExpiresBeforeSend()


class CancelIncomplete(DomainError):
    code = "cancel_incomplete"
    http_status = http.HTTP_503_SERVICE_UNAVAILABLE

    def __init__(self, *, cancelled: int) -> None:
        super().__init__(
            f"{cancelled} notifications were cancelled, but others with this key stayed locked "
            "by another transaction; send the cancel again (it is safe to repeat)."
        )
        self.headers = {"Retry-After": "1"}


def notifications_cancel_by_key(
    *,
    client_id: uuid.UUID,
    cancellation_key: str,
    repository: NotificationStore | None = None,
) -> int:
    """Cancels every notification of the client with this cancellation key whose send has not
    started: PENDING (whatever holds it) or claimed by a worker that has not yet started the
    send. Returns how many, once all are CANCELLED; a send already started finishes as it
    would have, and none starts after this returns."""
    repository = repository or NotificationRepository()
    try:
        cancelled = repository.cancel_by_key(
            client_id=client_id, cancellation_key=cancellation_key, batch=CANCEL_BATCH
        )
    except CancelNotFinished as incomplete:
        raise CancelIncomplete(cancelled=incomplete.cancelled) from incomplete
    log.info(
        "notifications cancelled by key client=%s cancelled=%d outcome=CANCELLED",
        client_id,
        cancelled,
    )
    if cancelled:
        metrics.notifications_cancelled(count=cancelled)
    return cancelled


def _notification_prepare(
    *,
    client_id: uuid.UUID,
    idempotency_key: str,
    request: NotificationRequest,
    renderer: TemplateRenderer,
    max_attempts: int,
) -> NewNotification:
    if request.digest_key is not None:
        content = _digest_item_render(client_id=client_id, request=request, renderer=renderer)
    elif request.template is not None:
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
        expires_at=request.expires_at,
        ttl_seconds=request.ttl_seconds,
        cancellation_key=request.cancellation_key,
        digest_key=request.digest_key,
        digest_window_seconds=request.digest_window_seconds,
        digest_at=request.digest_at,
    )


def _digest_item_render(
    *, client_id: uuid.UUID, request: NotificationRequest, renderer: TemplateRenderer
) -> RenderedContent:
    """A digest-keyed create's content: its template rendered as a digest of itself alone, so
    that the first of a window, which goes at once, reads as one: `{digest_count}` 1 and
    `{digest_items}` its own line (`digest_item_line`: its subject, or its body where it has
    none). The client's payload may fill either slot itself; the stored payload is the
    client's as sent. One rendering: the line's place is marked, and filled once it is known."""
    payload = dict(request.payload or {})
    if "digest_items" in payload:
        payload.setdefault("digest_count", 1)
        return renderer.render(client_id=client_id, request=replace(request, payload=payload))
    mark = f"\ue000{uuid.uuid4().hex}\ue001"
    payload = {"digest_count": 1, **payload, "digest_items": mark}
    alone = renderer.render(client_id=client_id, request=replace(request, payload=payload))
    line = digest_item_line(
        subject=alone.subject.replace(mark, ""), body=alone.body.replace(mark, "")
    )
    subject = alone.subject.replace(mark, line)
    if len(subject) > SUBJECT_MAX_LENGTH:
        message = f"The subject is at most {SUBJECT_MAX_LENGTH} characters after rendering."
        raise InvalidRequest(f"payload: {message}", fields={"payload": [message]})
    return replace(alone, subject=subject, body=alone.body.replace(mark, line))


def _insert_digest(*, new: NewNotification, repository: NotificationStore) -> CreateResult:
    inserted = repository.insert_digest(new=new)
    if not inserted.created:
        return _replay(existing=inserted.record, fingerprint=new.request_fingerprint)
    metrics.notification_created(channel=inserted.record.channel)
    _digest_collected_count([inserted])
    return CreateResult(notification=inserted.record, created=True)


def _digest_collected_count(inserted: Sequence[Inserted]) -> None:
    """Counts the new rows a digest bucket collected (not the first of each window)."""
    by_channel: Counter[str] = Counter(
        result.record.channel for result in inserted if result.record.digest_bucket_id
    )
    for channel, count in by_channel.items():
        metrics.digest_events_collected(channel=channel, count=count)


def _insert_key_checked(
    *, new: NewNotification, repository: NotificationStore, key: UnconfirmedKey
) -> CreateResult:
    """The insert that also checks the API key. Nothing inserted (the key is no longer usable,
    or the idempotency key is taken) or refused: the key is confirmed, then the insert alone
    answers (the key's holder: a replay or a conflict) or the refusal stands."""
    try:
        inserted = repository.insert(new=new, key_check=key.check)
    except KeyCheckFailed:
        key.confirm()
        return _insert(new=new, repository=repository)
    except DomainError:
        key.confirm()
        raise
    metrics.notification_created(channel=inserted.channel)
    return CreateResult(notification=inserted, created=True)


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
