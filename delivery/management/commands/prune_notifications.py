"""`manage.py prune_notifications --older-than 30d [--batch 1000]`.

Drops each week of notifications that ended before the cutoff (its partition of the
notification table), after deleting the week's attempts, webhook events, inbox messages and
rate-limit records in short batches; a week with a row still waiting, or a webhook still being
delivered, stays whole. Then deletes, in short batches (one statement each, skipping rows
another transaction holds), the finished rows before the cutoff that lie outside every week
(made before the table was partitioned). Prints each week, each batch and the totals. The
cutoff is the database clock when the run starts, minus the age. Once a notification is pruned
its idempotency key may be used again.
"""

from __future__ import annotations

import re

from django.core.management.base import BaseCommand, CommandError

from delivery import retention
from delivery.repositories import PRUNE_START
from notifyqueue.errors import DomainError

AGE = re.compile(r"(\d+)([dhms])")
UNIT_S = {"d": 86_400, "h": 3_600, "m": 60, "s": 1}


def age_seconds(text: str) -> int:
    """`30d`, `12h`, `90m` or `3600s` in seconds."""
    found = AGE.fullmatch(text.strip())
    if found is None:
        raise CommandError(f"--older-than takes a number and d, h, m or s (e.g. 30d): {text!r}.")
    return int(found[1]) * UNIT_S[found[2]]


class Command(BaseCommand):
    help = "Deletes finished notifications older than an age, with their history, in batches."

    def add_arguments(self, parser):
        parser.add_argument("--older-than", required=True, help="e.g. 30d, 12h (d, h, m, s)")
        parser.add_argument(
            "--batch", type=int, default=retention.PRUNE_BATCH, help="rows scanned per batch"
        )

    def handle(self, *args, older_than, batch, **options):
        try:
            cutoff = retention.notifications_prune_cutoff(older_than_s=age_seconds(older_than))
            weeks, deleted, attempts = 0, 0, 0
            for week in retention.history_weeks_prune(cutoff=cutoff, batch=batch):
                if week.dropped:
                    weeks += 1
                    deleted += week.notifications
                    attempts += week.attempts
                    what = f"dropped ({week.notifications} notification(s))"
                elif week.held:
                    what = "kept: a notification of it still waits or reports"
                else:
                    what = "kept: the table was busy, the next run tries again"
                self.stdout.write(f"week {week.name}: {what}")
            position, batches = PRUNE_START, 0
            while True:
                step = retention.notifications_prune_step(
                    cutoff=cutoff, after=position, batch=batch
                )
                if step.position is None:
                    break
                batches += 1
                deleted += step.deleted
                attempts += step.attempts_deleted
                position = step.position
                self.stdout.write(
                    f"batch {batches}: deleted {step.deleted} of {step.scanned} scanned "
                    f"(created up to {position.created_at.isoformat()}), total {deleted}"
                )
            buckets = 0
            while step_buckets := retention.digests_prune_step(cutoff=cutoff, batch=batch):
                buckets += step_buckets
        except DomainError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(
            f"done: deleted {deleted} notification(s) finished before {cutoff.isoformat()} "
            f"and {attempts} delivery attempt(s), in {weeks} week(s) and {batches} batch(es), "
            f"and {buckets} digest bucket(s) closed before it"
        )
