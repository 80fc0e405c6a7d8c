"""Which provider serves which channel, from settings (contract section 2)."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from delivery.providers.base import Provider
from delivery.providers.http import HttpProvider
from delivery.providers.in_app import InAppProvider
from delivery.providers.simulated import SimulatedProvider
from delivery.providers.smtp import SmtpProvider
from notifyqueue.outbound import OutboundRefused, OutboundUnresolved, outbound_target_resolve


def providers_from_settings() -> dict[str, Provider]:
    timeout_s = settings.NOTIFYQUEUE_PROVIDER_TIMEOUT_SECONDS
    providers: dict[str, Provider] = {"in_app": InAppProvider()}
    for channel, config in settings.NOTIFYQUEUE_PROVIDERS.items():
        kind = config["provider"]
        if kind == "simulated":
            providers[channel] = SimulatedProvider(
                failure_rate=settings.NOTIFYQUEUE_SIMULATED_FAILURE_RATE
            )
        elif kind == "http":
            if not config["url"]:
                raise ImproperlyConfigured(
                    f"NOTIFYQUEUE_{channel.upper()}_PROVIDER=http needs "
                    f"NOTIFYQUEUE_{channel.upper()}_PROVIDER_URL"
                )
            _provider_url_check(channel, config["url"])
            providers[channel] = HttpProvider(
                url=config["url"],
                timeout_s=timeout_s,
                allow_private=settings.NOTIFYQUEUE_WEBHOOK_ALLOW_PRIVATE,
            )
        elif kind == "smtp" and channel == "email":
            providers[channel] = SmtpProvider(timeout_s=timeout_s)
        else:
            raise ImproperlyConfigured(
                f"NOTIFYQUEUE_{channel.upper()}_PROVIDER={kind!r}: expected simulated or http"
                + (" or smtp" if channel == "email" else "")
            )
    return providers


def _provider_url_check(channel: str, url: str) -> None:
    """Provider URLs obey the same address rules as webhook URLs (contract section 2):
    private, loopback and link-local targets need NOTIFYQUEUE_WEBHOOK_ALLOW_PRIVATE."""
    try:
        outbound_target_resolve(url, allow_private=settings.NOTIFYQUEUE_WEBHOOK_ALLOW_PRIVATE)
    except OutboundRefused as exc:
        raise ImproperlyConfigured(f"NOTIFYQUEUE_{channel.upper()}_PROVIDER_URL: {exc}") from exc
    except OutboundUnresolved:
        pass  # DNS may come back; each call then fails temporarily until it does
