"""The webhook outbox: one row per final status change, written in the same transaction.

Invariants: an event exists if and only if the status change that caused it committed
(the insert is part of the finishing statement); `id` is the eventId the receiver sees and
never changes across redeliveries; a DELIVERING event always names its claim (token and
expiry) and no other event does; every POST is recorded as one WebhookDeliveryAttempt, opened
by the claim that started it and finished only by the holder of that claim's token.
"""

import uuid

from django.db import models
from django.db.models import Q

from notifications.models import Status


class DeliveryState(models.TextChoices):
    PENDING = "PENDING"
    DELIVERING = "DELIVERING"
    DELIVERED = "DELIVERED"
    FAILED = "FAILED"


# The statuses an event reports: the final statuses the outbox trigger writes one for
# (webhooks/sql/functions/notification_webhook_outbox.sql).
REPORTED_STATUSES = (
    Status.SENT,
    Status.FAILED,
    Status.DEAD_LETTERED,
    Status.SUPPRESSED,
    Status.EXPIRED,
    Status.DIGESTED,
)


class WebhookEvent(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index of its own: a lookup by client is served by webhook_event_client_recent.
    client = models.ForeignKey(
        "clients.Client", on_delete=models.CASCADE, related_name="+", db_index=False
    )
    # No database constraint: the event is written by the trigger on the notification's own
    # update (docs/technical-design.md, "Foreign keys the hot path does not check").
    notification = models.ForeignKey(
        "notifications.Notification",
        on_delete=models.CASCADE,
        related_name="webhook_events",
        db_constraint=False,
    )
    # What is reported: the notification's status and attempt count at the change.
    status = models.CharField(
        max_length=16, choices=[(s.value, s.value) for s in REPORTED_STATUSES]
    )
    attempt_count = models.PositiveIntegerField()
    occurred_at = models.DateTimeField()
    # `status` (a final status change, written by the outbox trigger) or `receipt.<type>` (a
    # provider's delivery receipt, written with the receipt); a receipt event also names the
    # receipt's type and the provider's message id.
    type = models.CharField(max_length=24, default="status", db_default="status")
    receipt = models.CharField(max_length=16, null=True, blank=True)
    message_id = models.TextField(null=True, blank=True)

    state = models.CharField(
        max_length=16, choices=DeliveryState.choices, default=DeliveryState.PENDING
    )
    delivery_attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    claim_token = models.UUIDField(null=True, blank=True)
    claim_expires_at = models.DateTimeField(null=True, blank=True)
    # The worker whose sender made the latest claim (NULL: a sender outside a worker, which
    # has no heartbeat); while DELIVERING, the worker whose death hands the claim over.
    claimed_by = models.CharField(max_length=200, null=True, blank=True)
    last_error = models.TextField(null=True, blank=True)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    # Operator redeliveries; a database default so the outbox INSERT need not name it.
    redeliveries = models.PositiveIntegerField(default=0, db_default=0)
    created_at = models.DateTimeField()

    class Meta:
        db_table = "webhook_event"
        permissions = [("redeliver_webhookevent", "Can redeliver webhook events")]
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=DeliveryState.values), name="webhook_event_state_valid"
            ),
            models.CheckConstraint(
                condition=(
                    Q(
                        state=DeliveryState.DELIVERING,
                        claim_token__isnull=False,
                        claim_expires_at__isnull=False,
                    )
                    | (
                        ~Q(state=DeliveryState.DELIVERING)
                        & Q(claim_token__isnull=True, claim_expires_at__isnull=True)
                    )
                ),
                name="webhook_event_claim_iff_delivering",
            ),
        ]
        # The sender's claim, the reaper and the health counts read webhook_queue's indexes
        # (the queue table's): here, on a table that keeps every delivered event, their entries
        # for delivered events stayed until a VACUUM of the whole history.
        indexes = [
            # The admin's list, newest first, a page at a time however many events there are:
            # all of them, one client's, and the given-up ones (few: a partial index).
            models.Index(fields=["-created_at", "-id"], name="webhook_event_recent"),
            models.Index(
                fields=["client", "-created_at", "-id"], name="webhook_event_client_recent"
            ),
            models.Index(
                fields=["-created_at", "-id"],
                name="webhook_event_failed",
                condition=Q(state=DeliveryState.FAILED),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.status} for {self.notification_id} [{self.state}]"


class WebhookQueueEntry(models.Model):
    """Every webhook event not yet final (PENDING or DELIVERING), narrow: what the sender's
    claim, the reaper and the health counts go through.

    Written only by the triggers on `webhook_event` (`webhook_queue_*`), in the statement that
    changes the event, under that event's row lock; never written directly. A row copies the
    event's client, state, due time, creation time, claim expiry and (while DELIVERING) the
    worker holding it; an event that becomes
    DELIVERED or FAILED leaves this table. So the entries a finished event leaves in the
    claim's indexes are dead rows of a table the size of the backlog, which VACUUM (and
    autovacuum, by its share of live rows) clears at the cost of the backlog, not of the whole
    delivered history. Statements that lock an event lock `webhook_event` (`FOR UPDATE OF e`),
    never this row, so lock order is always the event first.
    """

    event = models.OneToOneField(
        WebhookEvent,
        primary_key=True,
        db_column="id",
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="queue_entry",
    )
    client_id = models.UUIDField()
    state = models.CharField(
        max_length=16,
        choices=[(s.value, s.value) for s in (DeliveryState.PENDING, DeliveryState.DELIVERING)],
    )
    next_attempt_at = models.DateTimeField()
    created_at = models.DateTimeField()
    claim_expires_at = models.DateTimeField(null=True)
    # A DELIVERING event's worker (the event's claimed_by); NULL in any other state.
    claimed_by = models.CharField(max_length=200, null=True)

    class Meta:
        db_table = "webhook_queue"
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                name="webhook_queue_due",
                condition=Q(state=DeliveryState.PENDING),
            ),
            models.Index(
                fields=["claim_expires_at"],
                name="webhook_queue_claim_expiry",
                condition=Q(state=DeliveryState.DELIVERING),
            ),
            # The fair claim: the distinct clients with waiting events (a skip scan), and
            # each one's oldest due events.
            models.Index(
                fields=["client_id", "next_attempt_at", "created_at"],
                name="webhook_queue_client_due",
                condition=Q(state=DeliveryState.PENDING),
            ),
            # The events in flight by worker: the takeover of a dead worker's claims
            # (webhooks/sql/webhook_events.sql, webhook_event_reclaim_expired). Only claims
            # that name a worker, which also keeps it out of the plan of the claim's count
            # of a client's events in flight (webhook_queue_client_busy's).
            models.Index(
                fields=["claimed_by"],
                name="webhook_queue_claimed_by",
                condition=Q(state=DeliveryState.DELIVERING, claimed_by__isnull=False),
            ),
            # Each client's events in flight, counted against its share of the senders.
            models.Index(
                fields=["client_id"],
                name="webhook_queue_client_busy",
                condition=Q(state=DeliveryState.DELIVERING),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.event_id} [{self.state}]"


class AttemptOutcome(models.TextChoices):
    DELIVERED = "DELIVERED"
    # Non-2xx answer, timeout or connection error: retried with backoff.
    TEMPORARY_FAILURE = "TEMPORARY_FAILURE"
    # The URL is refused (scheme, private address) or missing: retrying cannot help.
    PERMANENT_FAILURE = "PERMANENT_FAILURE"
    # The claim expired before the sender reported back (it died or stalled).
    ABANDONED = "ABANDONED"


class WebhookDeliveryAttempt(models.Model):
    """One POST of one event; `number` counts every attempt the event ever had, from 1."""

    # Found by event through the unique (event, number) index: no index of the event alone.
    event = models.ForeignKey(
        WebhookEvent, on_delete=models.CASCADE, related_name="attempts", db_index=False
    )
    claim_token = models.UUIDField(unique=True)
    number = models.PositiveIntegerField()
    url = models.CharField(max_length=2000)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=24, choices=AttemptOutcome.choices, null=True, blank=True)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.TextField(null=True, blank=True)
    duration_ms = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        db_table = "webhook_delivery_attempt"
        constraints = [
            models.UniqueConstraint(
                fields=["event", "number"], name="webhook_delivery_attempt_event_number"
            ),
            models.CheckConstraint(
                condition=Q(outcome__in=AttemptOutcome.values) | Q(outcome__isnull=True),
                name="webhook_delivery_attempt_outcome_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"attempt {self.number} of event {self.event_id}: {self.outcome or 'running'}"
