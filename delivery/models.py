"""What the worker records: every attempt, every live worker and the simulated provider's memory.

Invariant: an attempt row is written by the claim that starts it and finished only by the
holder of that claim's token.
"""

from django.db import models

from notifications.models import recipient_digest


class Outcome(models.TextChoices):
    SENT = "SENT"
    TEMPORARY_FAILURE = "TEMPORARY_FAILURE"
    PERMANENT_FAILURE = "PERMANENT_FAILURE"
    # The claim expired before the worker reported back (it crashed or stalled).
    ABANDONED = "ABANDONED"
    # Given back without trying: shutdown, or the recipient's rate limit.
    RELEASED = "RELEASED"
    RATE_LIMITED = "RATE_LIMITED"
    # Not tried because the user's preferences changed while it waited: moved to a fallback
    # channel, or no allowed channel was left.
    REROUTED = "REROUTED"
    SUPPRESSED = "SUPPRESSED"
    # Not tried: its expiry passed while it was claimed, or a cancel by key took the claim
    # before its send started. The attempt is given back.
    EXPIRED = "EXPIRED"
    CANCELLED = "CANCELLED"


class DeliveryAttempt(models.Model):
    # No index of its own: attempt_by_notif leads with it (every claim inserts an attempt, so
    # each index on this table is paid per message). No database constraint: the claim writes
    # the attempt from the row it is updating (docs/technical-design.md, "Foreign keys the
    # hot path does not check").
    notification = models.ForeignKey(
        "notifications.Notification",
        on_delete=models.CASCADE,
        related_name="attempts",
        db_index=False,
        db_constraint=False,
    )
    claim_token = models.UUIDField(unique=True)
    number = models.PositiveIntegerField()
    channel = models.CharField(max_length=16)
    worker = models.CharField(max_length=200)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=24, choices=Outcome.choices, null=True, blank=True)
    error = models.TextField(null=True, blank=True)
    # Text, not varchar: whatever a provider answers (bounded by the provider) is stored.
    provider_message_id = models.TextField(null=True, blank=True)

    class Meta:
        db_table = "delivery_attempt"
        indexes = [
            models.Index(fields=["notification", "started_at"], name="attempt_by_notif"),
            # A provider's receipt names the message by the provider's id, whatever its length:
            # its digest is the key. Only accepted attempts have one.
            models.Index(
                recipient_digest(models.F("provider_message_id")),
                name="attempt_by_message_id",
                condition=models.Q(provider_message_id__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"attempt {self.number} of {self.notification_id}: {self.outcome or 'running'}"


class WorkerHeartbeat(models.Model):
    worker_id = models.CharField(max_length=200, primary_key=True)
    hostname = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True, blank=True)
    delivered = models.PositiveBigIntegerField(default=0)
    # Asleep on LISTEN, or about to be: creates notify while any worker is (`notification_wakeup`).
    waiting = models.BooleanField(default=False, db_default=False)

    class Meta:
        db_table = "worker_heartbeat"
        indexes = [
            # The creates' wake-up trigger asks whether any row is waiting: a probe, however
            # many workers have ever run.
            models.Index(
                fields=["worker_id"], name="worker_waiting", condition=models.Q(waiting=True)
            ),
        ]

    def __str__(self) -> str:
        return self.worker_id


class SimulatedProviderMessage(models.Model):
    """The simulated provider's idempotency store, shared by every worker."""

    idempotency_key = models.CharField(max_length=300, primary_key=True)
    channel = models.CharField(max_length=16)
    recipient = models.TextField()
    calls = models.PositiveIntegerField(default=0)
    # Set once the provider has answered finally (accepted or rejected); later calls repeat it.
    outcome = models.CharField(max_length=24, null=True, blank=True)
    message_id = models.TextField(null=True, blank=True)
    sends = models.PositiveIntegerField(default=0)
    first_call_at = models.DateTimeField()
    last_call_at = models.DateTimeField()

    class Meta:
        db_table = "simulated_provider_message"

    def __str__(self) -> str:
        return self.idempotency_key


class ClientTurn(models.Model):
    """When the claim last served a client: clients with due rows take their turns in the order
    they were last served, the one served longest ago (or never) first. Written only by the
    claim (`notification_claim_due_many`): `served_claim` numbers the claim, from the sequence
    `delivery_client_turn_claim`, and `served_position` is the place of the client's last row
    in it."""

    client = models.OneToOneField(
        "clients.Client",
        on_delete=models.CASCADE,
        primary_key=True,
        related_name="+",
    )
    served_claim = models.BigIntegerField()
    served_position = models.BigIntegerField()

    class Meta:
        db_table = "delivery_client_turn"

    def __str__(self) -> str:
        return f"{self.client_id}: served at claim {self.served_claim}"
