"""The rolling-window record: one row per delivery admitted for a (client, recipient).

Invariants: for any key, the rows with `at` inside any window of
NOTIFYQUEUE_RATE_LIMIT_WINDOW_SECONDS number at most NOTIFYQUEUE_RATE_LIMIT, and, while the
ceiling is on, for any address_key at most NOTIFYQUEUE_RECIPIENT_RATE_LIMIT, except where
CRITICAL notifications (admitted without a check, but recorded) push them over.
"""

from django.db import models


class RecipientDelivery(models.Model):
    # sha256 of the window's key (`ratelimit_key()` in SQL): channel, client and the
    # recipient's counting form (notifyqueue/addresses.py), so one client never spends
    # another's window. A digest keeps the index entry bounded whatever the recipient's length
    # (a push token may be 4,096 characters).
    key = models.BinaryField()
    # The same without the client (`ratelimit_key(channel, NULL, ...)`): the service-wide
    # ceiling's key per address. Written only while NOTIFYQUEUE_RECIPIENT_RATE_LIMIT is on (and
    # never for in-app, whose user ids are per client), so with the ceiling off a delivery
    # writes no entry in its index.
    address_key = models.BinaryField(null=True)
    at = models.DateTimeField()
    # No database constraint: the admission records a row its worker has just claimed
    # (docs/technical-design.md, "Foreign keys the hot path does not check").
    notification = models.ForeignKey(
        "notifications.Notification",
        on_delete=models.CASCADE,
        related_name="+",
        db_constraint=False,
    )
    # The claim that was admitted; a failed attempt's row is deleted by its finish. The primary
    # key: a claim is admitted once, and a surrogate key was one more index entry and sequence
    # value per delivery.
    claim_token = models.UUIDField(primary_key=True)

    class Meta:
        db_table = "ratelimit_delivery"
        indexes = [
            models.Index(fields=["key", "at"], name="ratelimit_key_at"),
            models.Index(fields=["at"], name="ratelimit_at"),
            models.Index(
                fields=["address_key", "at"],
                name="ratelimit_address_key_at",
                condition=models.Q(address_key__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{bytes(self.key).hex()[:12]} at {self.at:%Y-%m-%d %H:%M:%S}"
