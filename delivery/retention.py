"""Retention: dropping the weeks of notifications older than a cutoff, with the rows of every
app that refer to them (attempts, webhook events, inbox messages, rate-limit records), so it
is the highest app's; and the digest buckets closed before the cutoff. No ORM here.

`notification` is partitioned by week of creation (notifyqueue/history.py): a week that ended
before the cutoff goes whole, its partition dropped, never a long DELETE of its rows; the other
tables' rows for it are deleted first, in short batches. Rows outside every week (the default
partition: made before the table was partitioned) are deleted in short batches instead.

Invariants protected here:
- retention deletes only finished rows, never one still waiting or whose webhook is still
  being delivered (a week holding one stays whole), and never inside a rate-limit window.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import OperationalError

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


def _batch_check(batch: int) -> None:
    if not 1 <= batch <= PRUNE_BATCH_MAX:
        message = f"Between 1 and {PRUNE_BATCH_MAX}."
        raise InvalidRequest(f"batch: {message}", fields={"batch": [message]})


@dataclass(frozen=True)
class WeekPruned:
    """One week's retention: `dropped`, or kept because a row of it still waits or has a
    webhook to deliver (`held`), or because its drop could not get its lock in time (`busy`:
    the next run tries again). `notifications` counts the week's rows walked."""

    name: str
    dropped: bool
    held: bool
    busy: bool
    notifications: int
    attempts: int


def history_weeks_prune(
    *, cutoff: datetime, batch: int = PRUNE_BATCH, repository: RetentionRepository | None = None
) -> Iterator[WeekPruned]:
    """Drops each week of notifications that ended by `cutoff`, oldest first: unless a row of
    it is still waiting or has a webhook to deliver, deletes the week's other history `batch`
    notifications a statement, then drops its partition (notification_week_drop)."""
    repository = repository or RetentionRepository()
    _batch_check(batch)
    for week in repository.history_weeks_before(cutoff=cutoff):
        if repository.history_week_held(week):
            yield WeekPruned(week.name, False, True, False, 0, 0)
            continue
        after, walked, attempts = uuid.UUID(int=0), 0, 0
        while (step := repository.history_week_prune_batch(week, after=after, scan=batch)).scanned:
            walked += step.scanned
            attempts += step.attempts_deleted
            after = step.last_id
        try:
            dropped = repository.notification_week_drop(week)
        except OperationalError:  # lock_timeout: the table was busy
            yield WeekPruned(week.name, False, False, True, walked, attempts)
            continue
        if dropped:
            log.info(
                "notification week dropped week=%s notifications=%d attempts=%d cutoff=%s",
                week.name,
                walked,
                attempts,
                cutoff.isoformat(),
            )
        yield WeekPruned(week.name, dropped, not dropped, False, walked, attempts)


def notifications_prune_step(
    *,
    cutoff: datetime,
    after: ListPosition,
    batch: int = PRUNE_BATCH,
    repository: RetentionRepository | None = None,
) -> PruneStep:
    """One retention batch of the rows outside every week (the default partition): of the next
    `batch` notifications created before `cutoff` (after `after`), deletes those that finished
    before it, with their attempts, webhook events, inbox messages and rate-limit records.
    Call again from the returned position until it scans nothing."""
    repository = repository or RetentionRepository()
    _batch_check(batch)
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
