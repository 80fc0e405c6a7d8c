"""The rolling-window record: one row per delivery admitted for a recipient.

Invariant: for any recipient, the rows with `at` inside any window of
NOTIFYQUEUE_RATE_LIMIT_WINDOW_SECONDS number at most NOTIFYQUEUE_RATE_LIMIT, except where
CRITICAL notifications (admitted without a check, but recorded) push it over.
"""

from django.db import models


class RecipientDelivery(models.Model):
    recipient = models.CharField(max_length=320)
    at = models.DateTimeField()
    notification = models.ForeignKey(
        "notifications.Notification", on_delete=models.CASCADE, related_name="+"
    )
    # The claim that was admitted; a failed attempt's row is deleted by its finish.
    claim_token = models.UUIDField(unique=True)

    class Meta:
        db_table = "ratelimit_delivery"
        indexes = [
            models.Index(fields=["recipient", "at"], name="ratelimit_recipient_at"),
            models.Index(fields=["at"], name="ratelimit_at"),
        ]

    def __str__(self) -> str:
        return f"{self.recipient} at {self.at:%Y-%m-%d %H:%M:%S}"
