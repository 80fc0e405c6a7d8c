"""A user's delivery preferences, per (client, user id).

`channels` is ordered: the first usable channel carries a notification and the rest are its
fallbacks, in that order. The in-app channel's address is the user id itself, so it is never
stored in `addresses`.

Quiet hours are windows of the user's local wall-clock time (`timezone`, `quiet_hours`) in
which a notification for the user waits; the delivery worker's quiet-hours stage holds it until
the window's end (`quiet_hours_until`, this app's SQL function, decides when that is).

The in-app inbox (the in_app channel's messages) is this app's table, which it serves over
HTTP. Invariant: an inbox message exists only for a SENT in-app notification; the worker's
finish (delivery's `notification_finish_many`) writes it in the statement that marks it SENT.
"""

import uuid

from django.db import models
from django.db.models import Q

from notifyqueue.vocabulary import USER_ID_MAX_LENGTH

# The longest IANA zone name is 32 characters (America/Argentina/ComodRivadavia).
TIMEZONE_MAX_LENGTH = 64


class UserPreferences(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index of its own: a lookup by client is served by user_preferences_client_user.
    client = models.ForeignKey(
        "clients.Client", on_delete=models.CASCADE, related_name="+", db_index=False
    )
    user_id = models.CharField(max_length=USER_ID_MAX_LENGTH)
    channels = models.JSONField(default=list, help_text="Ordered; doubles as the fallback chain.")
    addresses = models.JSONField(default=dict, help_text="Channel to address (not in_app).")
    muted_events = models.JSONField(default=list)
    disabled_channels = models.JSONField(default=list)
    # The user's local time: an IANA zone name as PostgreSQL's time zone database spells it
    # (pg_timezone_names), which alone turns wall-clock times into instants (quiet_hours_until).
    timezone = models.CharField(max_length=TIMEZONE_MAX_LENGTH, default="UTC", db_default="UTC")
    # Windows of local wall-clock time in which nothing but CRITICAL goes out:
    # [{"start": "22:00", "end": "07:30", "channels": ["email"]}], "channels" left out for all.
    quiet_hours = models.JSONField(default=list, db_default=[], blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "user_preferences"
        verbose_name_plural = "user preferences"
        constraints = [
            models.UniqueConstraint(
                fields=["client", "user_id"], name="user_preferences_client_user"
            )
        ]
        # The admin's search, an exact user id whatever the client.
        indexes = [models.Index(fields=["user_id"], name="user_preferences_user")]

    def __str__(self) -> str:
        return f"preferences of {self.user_id}"


class InboxMessage(models.Model):
    """An in-app notification as the user's inbox shows it."""

    id = models.UUIDField(primary_key=True)
    # No index of its own: a lookup by client is served by inbox_by_user's prefix (one index
    # entry fewer per in-app message).
    client = models.ForeignKey(
        "clients.Client", on_delete=models.CASCADE, related_name="+", db_index=False
    )
    # The in-app recipient as the notification stored it, however long the API allowed it.
    user_id = models.TextField()
    # No database constraint: a notification's history partition is dropped whole, with its
    # week's inbox messages deleted first (delivery/retention.py).
    notification = models.OneToOneField(
        "notifications.Notification",
        on_delete=models.CASCADE,
        related_name="inbox_message",
        db_constraint=False,
    )
    subject = models.TextField(blank=True, default="")
    body = models.TextField()
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField()
    read_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "inbox_message"
        indexes = [
            # A user's inbox pages, newest first, by keyset on (created_at, id): each page is
            # read off one of these in order, all messages or the unread ones, whatever the
            # user's history (the unread index held no order: a page of unread messages sorted
            # every unread message of the user).
            models.Index(fields=["client", "user_id", "-created_at", "-id"], name="inbox_by_user"),
            models.Index(
                fields=["client", "user_id", "-created_at", "-id"],
                name="inbox_unread",
                condition=Q(read_at__isnull=True),
            ),
        ]

    def __str__(self) -> str:
        return f"inbox {self.user_id}: {self.subject or self.body[:40]}"
