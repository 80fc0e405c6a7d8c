"""Operator retries of FAILED and DEAD_LETTERED notifications, one or in bulk. No ORM here.

Invariants protected here:
- only FAILED and DEAD_LETTERED notifications can be retried, each retry is one guarded write
  that starts the attempts again at 0 and records who retried it and when; a bulk retry takes
  at most one batch, oldest first, and never sends one row back twice in one run.

Every retry is logged as one `key=value` line (logger `notifyqueue.notifications`).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime

from monitoring import metrics
from notifications.models import Status
from notifications.repositories import NotificationRecord, NotificationRepository
from notifications.services import NotificationNotFound, NotificationStore
from notifyqueue.errors import Conflict, InvalidRequest

RETRYABLE_STATUSES = (Status.FAILED, Status.DEAD_LETTERED)
# One bulk retry call sends back at most this many: each call is one short UPDATE, and a
# recovered provider does not get the whole dead-letter queue in one burst.
BULK_RETRY_LIMIT = 1000
BULK_RETRY_LIMIT_MAX = 10_000

log = logging.getLogger("notifyqueue.notifications")


class NotificationNotRetryable(Conflict):
    code = "not_retryable"


@dataclass(frozen=True)
class BulkRetryResult:
    retried: int
    # Rows still in that status (and channel) that a further call would retry.
    remaining: int


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
