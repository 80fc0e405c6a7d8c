"""Start-up checks of the receipts and unsubscribe settings (`manage.py check` and every
command run them; the missing public URL only under `check --deploy`)."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register

from delivery.receipts.services import provider_secret_problem
from delivery.unsubscribe.services import MIN_TOKEN_DAYS


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


@register()
def unsubscribe_settings_check(app_configs, **kwargs) -> list[Error]:
    errors = []
    if settings.NOTIFYQUEUE_PUBLIC_URL and not settings.NOTIFYQUEUE_UNSUBSCRIBE_SECRET:
        errors.append(
            Error(
                "NOTIFYQUEUE_PUBLIC_URL is set but NOTIFYQUEUE_UNSUBSCRIBE_SECRET is not: "
                "unsubscribe links cannot be signed.",
                id="receipts.E003",
            )
        )
    if settings.NOTIFYQUEUE_UNSUBSCRIBE_TOKEN_DAYS < MIN_TOKEN_DAYS:
        errors.append(
            Error(
                f"NOTIFYQUEUE_UNSUBSCRIBE_TOKEN_DAYS must be at least {MIN_TOKEN_DAYS}.",
                id="receipts.E004",
            )
        )
    return errors


@register(Tags.compatibility, deploy=True)
def unsubscribe_deploy_check(app_configs, **kwargs) -> list[Warning]:
    if settings.NOTIFYQUEUE_PUBLIC_URL:
        return []
    return [
        Warning(
            "NOTIFYQUEUE_PUBLIC_URL is not set: emails carry no List-Unsubscribe header "
            "(one-click unsubscribe, RFC 8058), which large mailbox providers expect.",
            id="receipts.W001",
        )
    ]
