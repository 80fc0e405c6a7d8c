"""Which webhook URLs Notify Queue will POST to (the SSRF rules).

A webhook URL is chosen by a client, so without these rules a client could make the worker
call services that only the worker can reach (cloud metadata at 169.254.169.254, an admin
port on localhost, databases on the private network). The rules are checked twice: when a
URL is saved (a first, cheap check on its text) and at every delivery after DNS resolution,
where the address that was checked is the one the connection then uses, so a name that
resolves differently a moment later (DNS rebinding) cannot slip through.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError

ALLOWED_SCHEMES = frozenset({"http", "https"})
DEFAULT_PORTS = {"http": 80, "https": 443}


class WebhookTargetRefused(Exception):
    """The URL may never be called: retrying cannot help."""


class WebhookTargetUnresolved(Exception):
    """DNS gave no answer this time; a later attempt may succeed."""


@dataclass(frozen=True)
class WebhookTarget:
    scheme: str
    host: str
    port: int
    address: str
    """The checked IP address; the connection goes here and nowhere else."""


def address_refusal(address: str) -> str | None:
    """Why `address` may not be called without NOTIFYQUEUE_WEBHOOK_ALLOW_PRIVATE, or None."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        # ::ffff:127.0.0.1 reaches 127.0.0.1; judge the IPv4 address it carries.
        ip = ip.ipv4_mapped
    for label, hit in (
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("unspecified", ip.is_unspecified),
        ("reserved", ip.is_reserved),
        ("private", ip.is_private),
        # Shared address space (100.64.0.0/10) and the like: not private, not public either.
        ("non-global", not ip.is_global),
    ):
        if hit:
            return f"{ip} is a {label} address"
    return None


def _split(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ALLOWED_SCHEMES:
        raise WebhookTargetRefused(f"webhook URL must be http or https, not {scheme or 'none'!r}")
    host = parts.hostname
    if not host:
        raise WebhookTargetRefused("webhook URL has no host")
    try:
        port = parts.port or DEFAULT_PORTS[scheme]
    except ValueError as exc:
        raise WebhookTargetRefused(f"webhook URL has an invalid port: {exc}") from exc
    return scheme, host, port


def _literal_refusal(host: str) -> str | None:
    if host == "localhost" or host.endswith(".localhost"):
        return f"{host} is a loopback name"
    try:
        return address_refusal(host)
    except ValueError:
        return None  # a name, not an address: judged after resolution


def webhook_url_validate(url: str) -> None:
    """Model/form validator: http(s) only, and no private address or localhost in the URL."""
    if not url:
        return
    try:
        _, host, _ = _split(url)
    except WebhookTargetRefused as exc:
        raise ValidationError(str(exc).capitalize() + ".", code="invalid") from exc
    refusal = None if settings.NOTIFYQUEUE_WEBHOOK_ALLOW_PRIVATE else _literal_refusal(host)
    if refusal:
        raise ValidationError(
            f"Webhook URL refused: {refusal} (set NOTIFYQUEUE_WEBHOOK_ALLOW_PRIVATE to allow).",
            code="private_address",
        )


def webhook_target_resolve(url: str, *, allow_private: bool) -> WebhookTarget:
    """Resolves the URL's host and checks every address it resolves to.

    Refuses the URL when any address is private, loopback, link-local, multicast, reserved or
    unspecified (unless `allow_private`): a name that mixes public and private answers is
    refused rather than gambled on.
    """
    scheme, host, port = _split(url)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise WebhookTargetUnresolved(f"cannot resolve {host}: {exc}") from exc
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses:
        raise WebhookTargetUnresolved(f"{host} resolved to no address")
    if not allow_private:
        for address in addresses:
            refusal = address_refusal(address)
            if refusal:
                raise WebhookTargetRefused(
                    f"webhook host {host} refused: {refusal} "
                    "(set NOTIFYQUEUE_WEBHOOK_ALLOW_PRIVATE to allow)"
                )
    return WebhookTarget(scheme=scheme, host=host, port=port, address=addresses[0])
