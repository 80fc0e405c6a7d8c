"""`manage.py retry_notifications --status DEAD_LETTERED|FAILED [--channel C] [--batch 1000]`.

Retries in batches (each one short UPDATE, oldest first) until none remain, printing each
batch and the total. Rows it has already sent back are not picked up again in the same run,
even if they fail again meanwhile, so it always ends.
"""

from __future__ import annotations

import getpass

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from notifications import retries
from notifications.models import Channel
from notifyqueue.errors import DomainError


class Command(BaseCommand):
    help = "Sends FAILED or DEAD_LETTERED notifications back to PENDING, in batches."

    def add_arguments(self, parser):
        parser.add_argument("--status", required=True, help="DEAD_LETTERED or FAILED")
        parser.add_argument("--channel", help=f"only this channel: {', '.join(Channel.values)}")
        parser.add_argument("--batch", type=int, default=retries.BULK_RETRY_LIMIT)

    def handle(self, *args, status, channel, batch, **options):
        status = status.upper()
        if status not in retries.RETRYABLE_STATUSES:
            raise CommandError(f"--status must be DEAD_LETTERED or FAILED, not {status!r}.")
        if channel is not None and channel.lower() not in Channel.values:
            raise CommandError(f"--channel must be one of {', '.join(Channel.values)}.")
        channel = channel and channel.lower()
        if not 1 <= batch <= retries.BULK_RETRY_LIMIT_MAX:
            raise CommandError(f"--batch must be between 1 and {retries.BULK_RETRY_LIMIT_MAX}.")
        started = timezone.now()
        operator = f"cli:{getpass.getuser()}"
        total = 0
        batches = 0
        while True:
            try:
                result = retries.notifications_retry_bulk(
                    status=status,
                    channel=channel,
                    limit=batch,
                    operator=operator,
                    now=timezone.now(),
                    retried_before=started,
                )
            except DomainError as exc:
                raise CommandError(exc.message) from exc
            if result.retried == 0:
                break
            batches += 1
            total += result.retried
            self.stdout.write(
                f"batch {batches}: retried {result.retried}, remaining {result.remaining}"
            )
            if result.remaining == 0:
                break
        scope = f"{status} on {channel}" if channel else status
        self.stdout.write(f"done: retried {total} {scope} notification(s) in {batches} batch(es)")
        if result.remaining:
            # Rows are left only when another retry holds them locked right now.
            self.stdout.write(
                f"{result.remaining} not retried: another retry is working on them; run again"
            )
