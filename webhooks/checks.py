"""Start-up checks of the webhook settings (`manage.py check` and every command run them)."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Error, register


@register()
def webhook_settings_check(app_configs, **kwargs) -> list[Error]:
    errors = []
    schedule = settings.NOTIFYQUEUE_WEBHOOK_RETRY_SCHEDULE
    if not schedule or any(step < 0 for step in schedule):
        errors.append(
            Error(
                "NOTIFYQUEUE_WEBHOOK_RETRY_SCHEDULE must list one or more waits in seconds, "
                f"none negative (got {schedule!r}).",
                id="webhooks.E001",
            )
        )
    if settings.NOTIFYQUEUE_WEBHOOK_CLIENT_CONCURRENCY < 1:
        errors.append(
            Error("NOTIFYQUEUE_WEBHOOK_CLIENT_CONCURRENCY must be at least 1.", id="webhooks.E002")
        )
    if (
        settings.NOTIFYQUEUE_WEBHOOK_CLAIM_TIMEOUT_SECONDS
        <= settings.NOTIFYQUEUE_WEBHOOK_TIMEOUT_SECONDS
    ):
        errors.append(
            Error(
                "NOTIFYQUEUE_WEBHOOK_CLAIM_TIMEOUT_SECONDS must exceed "
                "NOTIFYQUEUE_WEBHOOK_TIMEOUT_SECONDS, or every slow POST is taken over and "
                "sent again.",
                id="webhooks.E003",
            )
        )
    return errors
