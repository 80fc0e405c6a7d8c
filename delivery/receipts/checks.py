"""Start-up checks of the receipts settings (`manage.py check` and every command run them)."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Error, register

from delivery.receipts.services import provider_secret_problem


@register()
def receipt_settings_check(app_configs, **kwargs) -> list[Error]:
    errors = []
    for channel, provider in settings.NOTIFYQUEUE_PROVIDERS.items():
        for secret in provider.get("events_secrets", ()):
            if problem := provider_secret_problem(secret):
                errors.append(
                    Error(
                        f"NOTIFYQUEUE_{channel.upper()}_PROVIDER_EVENTS_SECRET: {problem} "
                        "(expected whsec_ and the base64 of a 16-64 byte key).",
                        id="receipts.E001",
                    )
                )
    if settings.NOTIFYQUEUE_RECEIPT_TOLERANCE_SECONDS <= 0:
        errors.append(
            Error("NOTIFYQUEUE_RECEIPT_TOLERANCE_SECONDS must be positive.", id="receipts.E002")
        )
    return errors
