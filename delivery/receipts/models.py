"""Provider delivery receipts: what a provider reports about a message after it accepted it.

Invariants:
- a receipt is recorded once per (channel, provider message id, type, bounce): the same
  report again changes nothing;
- a receipt is applied (matched to the SENT attempt whose provider message id it names, on
  its own channel only) exactly once: `notification` is set by the statement that applies
  it, and only while it is null; until then the receipt is pending;
- a signed event's id (`webhook-id`) is accepted once per channel while its signature's
  timestamp is within the tolerance, so a replay inside that window is refused and one
  outside it is stale.
"""

import uuid

from django.db import models
from django.db.models import Q

from notifications.models import recipient_digest


class ReceiptType(models.TextChoices):
    DELIVERED = "delivered"
    BOUNCED = "bounced"
    COMPLAINED = "complained"
    OPTED_OUT = "opted_out"
    FAILED = "failed"


class Bounce(models.TextChoices):
    HARD = "hard"
    SOFT = "soft"


# A notification's `receipt` keeps these once it has one: a later report never overwrites them.
STICKY_TYPES = frozenset({ReceiptType.BOUNCED, ReceiptType.COMPLAINED})


class Receipt(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    channel = models.CharField(max_length=16)
    # The provider's id, whole (as long as an attempt can store: delivery/providers/http.py
    # MESSAGE_ID_MAX_CHARS); matched through its digest's index.
    message_id = models.TextField()
    type = models.CharField(max_length=16, choices=ReceiptType.choices)
    bounce = models.CharField(max_length=8, choices=Bounce.choices, null=True, blank=True)
    # The provider's time of the event, as it reported it.
    occurred_at = models.DateTimeField()
    received_at = models.DateTimeField()
    # The signed event that carried it (`webhook-id`).
    event_id = models.CharField(max_length=255)
    # Null while pending (no SENT attempt has that message id yet); no database constraint,
    # as the attempts' own reference (docs/technical-design.md, "Foreign keys the hot path
    # does not check").
    notification = models.ForeignKey(
        "notifications.Notification",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="receipts",
        db_constraint=False,
        db_index=False,
    )
    client_id = models.UUIDField(null=True, blank=True)
    applied_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "delivery_receipt"
        constraints = [
            models.UniqueConstraint(
                models.F("channel"),
                recipient_digest(models.F("message_id")),
                models.F("type"),
                models.functions.Coalesce(models.F("bounce"), models.Value("")),
                name="receipt_once",
            ),
            models.CheckConstraint(
                condition=Q(type__in=ReceiptType.values), name="receipt_type_valid"
            ),
        ]
        indexes = [
            # The notification's receipts, oldest first (the API and the admin).
            models.Index(
                fields=["notification", "received_at"],
                name="receipt_by_notification",
                condition=Q(notification__isnull=False),
            ),
            # Pending receipts: matched by message id at a finish, and pruned when too old.
            models.Index(
                recipient_digest(models.F("message_id")),
                models.F("channel"),
                name="receipt_pending",
                condition=Q(notification__isnull=True),
            ),
            models.Index(
                fields=["received_at"],
                name="receipt_pending_age",
                condition=Q(notification__isnull=True),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.type} for {self.channel} message {self.message_id[:40]}"


class ProviderEventSeen(models.Model):
    """The ids of signed provider events accepted lately: a replay is refused. Kept a while
    past the signature's tolerance (older ones are stale anyway), then pruned."""

    channel = models.CharField(max_length=16)
    event_id = models.CharField(max_length=255)
    received_at = models.DateTimeField()

    class Meta:
        db_table = "provider_event_seen"
        constraints = [
            models.UniqueConstraint(fields=["channel", "event_id"], name="provider_event_once")
        ]
        indexes = [models.Index(fields=["received_at"], name="provider_event_seen_age")]

    def __str__(self) -> str:
        return f"{self.channel} event {self.event_id[:40]}"
