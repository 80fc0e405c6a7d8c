"""A user's delivery preferences, per (client, user id).

`channels` is ordered: the first usable channel carries a notification and the rest are its
fallbacks, in that order. The in-app channel's address is the user id itself, so it is never
stored in `addresses`. The in-app inbox (the in_app channel's messages) is
`delivery.models.InboxMessage`, written by the worker; this app serves it over HTTP.
"""

import uuid

from django.db import models

from notifyqueue.vocabulary import USER_ID_MAX_LENGTH


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
