"""The webhook outbox: one row per final status change, written in the same transaction.

Invariants: an event exists if and only if the status change that caused it committed
(the insert is part of the finishing statement); `id` is the eventId the receiver sees and
never changes across redeliveries.
"""

import uuid

from django.db import models
from django.db.models import Q


class DeliveryState(models.TextChoices):
    PENDING = "PENDING"
    DELIVERING = "DELIVERING"
    DELIVERED = "DELIVERED"
    FAILED = "FAILED"


class WebhookEvent(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    client = models.ForeignKey("clients.Client", on_delete=models.CASCADE, related_name="+")
    notification = models.ForeignKey(
        "notifications.Notification", on_delete=models.CASCADE, related_name="webhook_events"
    )
    # What is reported: the notification's status and attempt count at the change.
    status = models.CharField(max_length=16)
    attempt_count = models.PositiveIntegerField()
    occurred_at = models.DateTimeField()

    state = models.CharField(
        max_length=16, choices=DeliveryState.choices, default=DeliveryState.PENDING
    )
    delivery_attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    claim_token = models.UUIDField(null=True, blank=True)
    claim_expires_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(null=True, blank=True)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        db_table = "webhook_event"
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=DeliveryState.values), name="webhook_event_state_valid"
            ),
        ]
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                name="webhook_event_due",
                condition=Q(state=DeliveryState.PENDING),
            ),
            models.Index(
                fields=["claim_expires_at"],
                name="webhook_event_claim_expiry",
                condition=Q(state=DeliveryState.DELIVERING),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.status} for {self.notification_id} [{self.state}]"
