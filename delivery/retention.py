"""Retention: deleting finished notifications older than a cutoff, in short batches. No ORM
here. It deletes rows of every app that refer to a notification (attempts, webhook events,
inbox messages, rate-limit records), so it is the highest app's; and the digest buckets closed
before the cutoff.

Invariants protected here:
- retention deletes only finished rows, never one still waiting or whose webhook is still
  being delivered, and never inside a rate-limit window.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.conf import settings

from delivery.repositories import PruneStep, RetentionRepository
from notifications.repositories import ListPosition
from notifyqueue.errors import InvalidRequest

# Retention: rows scanned per batch. Each batch is one short statement; its locks last only as
# long as that batch's deletes.
PRUNE_BATCH = 1000
PRUNE_BATCH_MAX = 10_000

log = logging.getLogger("notifyqueue.notifications")


def notifications_prune_cutoff(
    *, older_than_s: float, repository: RetentionRepository | None = None
) -> datetime:
    """The moment before which finished notifications may go: the database clock minus
    `older_than_s`, which may not be shorter than the rate-limit window (the window counts
    the records that retention deletes with their notifications)."""
    repository = repository or RetentionRepository()
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
    repository: RetentionRepository | None = None,
) -> PruneStep:
    """One retention batch: of the next `batch` notifications created before `cutoff` (after
    `after`), deletes those that finished before it, with their attempts, webhook events,
    inbox messages and rate-limit records. Call again from the returned position until it
    scans nothing."""
    repository = repository or RetentionRepository()
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


def digests_prune_step(
    *, cutoff: datetime, batch: int = PRUNE_BATCH, repository: RetentionRepository | None = None
) -> int:
    """One retention batch of digest buckets: deletes up to `batch` of those closed before
    `cutoff` (an open or closing bucket stays). Call again until it deletes none."""
    repository = repository or RetentionRepository()
    deleted = repository.prune_digests(cutoff=cutoff, limit=batch)
    if deleted:
        log.info("digest buckets pruned count=%d cutoff=%s", deleted, cutoff.isoformat())
    return deleted
