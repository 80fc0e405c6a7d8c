"""The only code that reads or writes clients and their keys."""

from __future__ import annotations

from dataclasses import dataclass

from django.db import IntegrityError, transaction

from clients.models import Client, ClientAPIKey
from notifyqueue.errors import Conflict


@dataclass(frozen=True)
class NewClient:
    name: str
    api_key: str
    webhook_secret: str


def client_create(*, name: str, webhook_url: str, is_operator: bool) -> NewClient:
    """Creates a client with one API key; the plain key exists only in the return value."""
    try:
        with transaction.atomic():
            client = Client.objects.create(
                name=name, webhook_url=webhook_url, is_operator=is_operator
            )
            _, key = ClientAPIKey.objects.create_key(name=f"{name} key", client=client)
    except IntegrityError as exc:
        raise Conflict(f"A client named {name!r} already exists.") from exc
    return NewClient(name=client.name, api_key=key, webhook_secret=client.webhook_secret)


def client_key_issue(*, name: str) -> NewClient | None:
    """Issues an additional key for an existing client, or None when there is no such client."""
    client = Client.objects.filter(name=name).first()
    if client is None:
        return None
    _, key = ClientAPIKey.objects.create_key(name=f"{name} key", client=client)
    return NewClient(name=client.name, api_key=key, webhook_secret=client.webhook_secret)
