"""The suppression list: addresses that are not sent to, checked at send time.

Invariants: an entry names a channel and an address in its counting form
(notifyqueue/addresses.py `recipient_key`, the rate limits' normalisation), and either one
client (`client` set: a complaint, an opt-out, an unsubscribe) or every client (`client`
null: a hard bounce, the address does not exist); there is at most one entry per (channel,
address, scope), so a repeated bounce or unsubscribe adds nothing.
"""

import uuid

from django.db import models


class Reason(models.TextChoices):
    HARD_BOUNCE = "hard_bounce"
    COMPLAINT = "complaint"
    OPTED_OUT = "opted_out"
    UNSUBSCRIBED = "unsubscribed"
    # Added by an operator (the API or the admin).
    OPERATOR = "operator"


# The reasons that suppress the address for every client; the others for one client only.
EVERY_CLIENT_REASONS = frozenset({Reason.HARD_BOUNCE})


class Suppression(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    channel = models.CharField(max_length=16)
    # The counting form, compared and never sent to; a push token may be 4,096 characters.
    address = models.TextField()
    # md5 of `address`: the lookup's index entry stays small whatever the address's length.
    address_digest = models.UUIDField()
    # Null: every client (the address does not exist).
    client = models.ForeignKey(
        "clients.Client", on_delete=models.CASCADE, null=True, blank=True, related_name="+"
    )
    reason = models.CharField(max_length=16, choices=Reason.choices)
    # Who or what added it: `receipt <message id>`, `unsubscribe`, an operator's name.
    source = models.CharField(max_length=300, blank=True, default="")
    created_at = models.DateTimeField()

    class Meta:
        db_table = "suppression"
        constraints = [
            # The send-time lookup's index too: (channel, digest) leads, both scopes at once.
            models.UniqueConstraint(
                fields=["channel", "address_digest", "client"],
                name="suppression_address_scope",
                nulls_distinct=False,
            ),
            models.CheckConstraint(
                condition=models.Q(reason__in=Reason.values), name="suppression_reason_valid"
            ),
        ]
        indexes = [models.Index(fields=["-created_at", "-id"], name="suppression_recent")]

    def __str__(self) -> str:
        scope = "every client" if self.client_id is None else f"client {self.client_id}"
        return f"{self.channel}:{self.address[:60]} ({self.reason}, {scope})"
