"""Message templates: one subject and body per (client, event, channel), with `{placeholder}`
slots filled from a create's payload (see templates/services.py for the syntax).

Invariants held by the database: one template per (client, event, channel); the channel is
one of the four.
"""

import uuid

from django.db import models
from django.db.models import Q

from notifyqueue.vocabulary import Channel

EVENT_MAX_LENGTH = 255
# RFC 5322's limit on one header line, for every subject: a template's, a rendered one and a
# direct create's.
SUBJECT_MAX_LENGTH = 998


class MessageTemplate(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    client = models.ForeignKey("clients.Client", on_delete=models.CASCADE, related_name="+")
    event = models.CharField(max_length=EVENT_MAX_LENGTH, help_text="e.g. order_shipped")
    channel = models.CharField(max_length=16, choices=Channel.choices)
    subject = models.TextField(blank=True, default="")
    body = models.TextField()
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "message_template"
        constraints = [
            models.UniqueConstraint(
                fields=["client", "event", "channel"], name="message_template_client_event_channel"
            ),
            models.CheckConstraint(
                condition=Q(channel__in=Channel.values), name="message_template_channel_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.event} / {self.channel}"
