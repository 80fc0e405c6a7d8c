"""The notification row: the queue and the record of each request are the same table.

Invariants held by the database itself (see docs/technical-design.md):
- one row per (client, idempotency_key);
- status, channel and priority take only their listed values;
- a PROCESSING row always names its claim (token, worker, expiry), and no other row does;
- attempt_count stays within 0..max_attempts + 1 (the one extra is the crash re-check).
"""

import uuid

from django.contrib.postgres.indexes import HashIndex
from django.db import models
from django.db.models import Q

from notifyqueue.vocabulary import RECIPIENT_MAX_LENGTH, Channel, Priority


class Status(models.TextChoices):
    PENDING = "PENDING"
    PROCESSING = "PROCESSING"
    SENT = "SENT"
    FAILED = "FAILED"
    DEAD_LETTERED = "DEAD_LETTERED"
    CANCELLED = "CANCELLED"
    SUPPRESSED = "SUPPRESSED"


FINAL_STATUSES = frozenset(
    {Status.SENT, Status.FAILED, Status.DEAD_LETTERED, Status.CANCELLED, Status.SUPPRESSED}
)


class Notification(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index of its own: every lookup by client is served by a composite index below.
    client = models.ForeignKey(
        "clients.Client", on_delete=models.PROTECT, related_name="+", db_index=False
    )
    idempotency_key = models.CharField(max_length=255)
    # sha256 of the canonical request, to tell a replay (200) from a reused key (409).
    request_fingerprint = models.CharField(max_length=64)

    channel = models.CharField(max_length=16, choices=Channel.choices)
    recipient = models.CharField(max_length=RECIPIENT_MAX_LENGTH)
    subject = models.TextField(blank=True, default="")
    body = models.TextField()
    priority = models.SmallIntegerField(choices=Priority.choices, default=Priority.NORMAL)
    metadata = models.JSONField(default=dict, blank=True)
    user_id = models.CharField(max_length=255, null=True, blank=True)
    template = models.CharField(max_length=255, null=True, blank=True)
    payload = models.JSONField(null=True, blank=True)
    fallback_channels = models.JSONField(default=list, blank=True)

    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    # send_at is what the client asked for; due_at is when the queue may next claim the row
    # (moved forward by backoff and rate-limit deferrals).
    send_at = models.DateTimeField()
    due_at = models.DateTimeField()
    # Set while a rate-limit deferral holds the row later than it would otherwise go: the due
    # time it had before (its send_at or retry backoff). A freed slot may move the row forward
    # again, never earlier than this.
    rate_deferred_from = models.DateTimeField(null=True, blank=True)
    attempt_count = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField()
    last_error = models.TextField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    operator_retries = models.PositiveIntegerField(default=0)
    # The latest operator retry: when, and who ("admin:<user>", "api:<client>", "cli:<user>").
    last_retried_at = models.DateTimeField(null=True, blank=True)
    last_retried_by = models.CharField(max_length=255, null=True, blank=True)

    claim_token = models.UUIDField(null=True, blank=True)
    claimed_by = models.CharField(max_length=200, null=True, blank=True)
    claim_expires_at = models.DateTimeField(null=True, blank=True)

    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "notification"
        permissions = [
            ("retry_notification", "Can retry failed and dead-lettered notifications"),
            ("cancel_notification", "Can cancel pending notifications"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["client", "idempotency_key"], name="notification_client_idempotency_key"
            ),
            models.CheckConstraint(
                condition=Q(status__in=Status.values), name="notification_status_valid"
            ),
            models.CheckConstraint(
                condition=Q(channel__in=Channel.values), name="notification_channel_valid"
            ),
            models.CheckConstraint(
                condition=Q(priority__gte=Priority.CRITICAL, priority__lte=Priority.LOW),
                name="notification_priority_valid",
            ),
            models.CheckConstraint(
                condition=(
                    Q(
                        status=Status.PROCESSING,
                        claim_token__isnull=False,
                        claimed_by__isnull=False,
                        claim_expires_at__isnull=False,
                    )
                    | (
                        ~Q(status=Status.PROCESSING)
                        & Q(claim_token__isnull=True, claim_expires_at__isnull=True)
                    )
                ),
                name="notification_claim_iff_processing",
            ),
            models.CheckConstraint(
                condition=Q(attempt_count__lte=models.F("max_attempts") + 1),
                name="notification_attempts_bounded",
            ),
        ]
        indexes = [
            # The claim reads the head of this index; it holds only waiting rows, so it stays
            # small however many finished rows accumulate.
            models.Index(
                fields=["priority", "due_at", "created_at"],
                name="notification_pending_claim",
                condition=Q(status=Status.PENDING),
            ),
            # The fair claim (delivery/sql/queries.sql): a loose index scan over the
            # (priority, client) pairs that have waiting rows, then each pair's due range.
            models.Index(
                fields=["priority", "client", "due_at", "created_at"],
                name="notification_pending_client",
                condition=Q(status=Status.PENDING),
            ),
            # The reaper looks for claims that expired.
            models.Index(
                fields=["claim_expires_at"],
                name="notification_claim_expiry",
                condition=Q(status=Status.PROCESSING),
            ),
            # A client's listing, newest first, and its filtered variants.
            models.Index(fields=["client", "-created_at", "-id"], name="notification_client_list"),
            models.Index(
                fields=["client", "status", "-created_at", "-id"],
                name="notification_client_status",
            ),
            # The create's backlog check counts one client's PENDING rows up to a limit; this
            # holds exactly those rows, so the count is an index-only scan of at most limit+1.
            models.Index(
                fields=["client"],
                name="notification_client_pending",
                condition=Q(status=Status.PENDING),
            ),
            # An operator's listing across every client, newest first.
            models.Index(fields=["-created_at", "-id"], name="notification_recent"),
            # The list's recipient filter. A hash index because a push token can be longer than
            # a btree entry allows (~2.7 kB); equality is the only lookup it needs, and one
            # recipient has few rows (rate-limited), so sorting them afterwards is cheap.
            HashIndex(fields=["recipient"], name="notification_recipient"),
            # The rows a rate-limit deferral holds back, by recipient: what a freed slot lets
            # forward (ratelimit_release_next, run for most admissions). Tiny, so its cost
            # does not grow with the backlog, and it gives the function's cached generic plan
            # a cheap path; without it the plan cache re-planned the look-up on every call.
            HashIndex(
                fields=["recipient"],
                name="notification_rate_held",
                condition=Q(rate_deferred_from__isnull=False),
            ),
            # What an operator retries: the dead-letter queue and permanent failures, oldest
            # first (bulk retry), newest first (the admin's status filter), and counted by
            # /status and /metrics (by channel and priority, index-only thanks to INCLUDE).
            # Partial, so the far larger SENT rows are not in it.
            models.Index(
                fields=["status", "created_at", "id"],
                include=["channel", "priority"],
                name="notification_operator_queue",
                condition=Q(status__in=[Status.FAILED, Status.DEAD_LETTERED]),
            ),
            # The admin's search by idempotency key across every client (the unique index
            # leads with client_id, so it cannot serve a search without one).
            models.Index(fields=["idempotency_key"], name="notification_idempotency_key"),
        ]

    def __str__(self) -> str:
        return f"{self.channel}:{self.recipient} [{self.status}]"
