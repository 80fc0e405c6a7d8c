"""The rolling-window record: one row per delivery admitted for a recipient.

Invariant: for any recipient, the rows with `at` inside any window of
NOTIFYQUEUE_RATE_LIMIT_WINDOW_SECONDS number at most NOTIFYQUEUE_RATE_LIMIT, except where
CRITICAL notifications (admitted without a check, but recorded) push it over.
"""

from django.db import models


class RecipientDelivery(models.Model):
    # sha256 of the rate-limit key (`ratelimit_key()` in SQL): the address itself for email,
    # SMS and push (it protects the person, whichever client sends), `in_app:<client>:<user>`
    # for in-app (a user id is only unique within its client). A digest keeps the index
    # entry bounded whatever the recipient's length (a push token may be 4,096 characters).
    key = models.BinaryField()
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
        ]

    def __str__(self) -> str:
        return f"{bytes(self.key).hex()[:12]} at {self.at:%Y-%m-%d %H:%M:%S}"
