"""The check a webhook URL gets when it is saved (it validates a `clients` field, so it lives
below clients and webhooks); the full rules (resolution, pinning, no redirects) apply at every
delivery and live in notifyqueue/outbound.py."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError

from notifyqueue.outbound import OutboundRefused, host_literal_refusal, url_split


def webhook_url_validate(url: str) -> None:
    """Model/form validator: http(s) only, and no private address or localhost in the URL."""
    if not url:
        return
    try:
        _, host, _ = url_split(url)
    except OutboundRefused as exc:
        raise ValidationError(f"Webhook {exc}.", code="invalid") from exc
    refusal = None if settings.NOTIFYQUEUE_WEBHOOK_ALLOW_PRIVATE else host_literal_refusal(host)
    if refusal:
        raise ValidationError(
            f"Webhook URL refused: {refusal} (set NOTIFYQUEUE_WEBHOOK_ALLOW_PRIVATE to allow).",
            code="private_address",
        )
