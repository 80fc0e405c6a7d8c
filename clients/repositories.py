"""The only code that reads or writes clients, their keys and their request counters.

Invariants protected here:
- a plain API key exists only in the value returned when it is issued; the table keeps a hash;
- the request throttle counts every request of a client in one shared row, with one statement,
  in windows of the database's clock, so all API processes agree on it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

from django.db import IntegrityError, transaction

from clients.models import Client, ClientAPIKey
from notifyqueue.errors import Conflict
from notifyqueue.sqlgateway import Queries

SQL = Queries(Path(__file__).with_name("sql") / "clients.sql")


@dataclass(frozen=True)
class NewClient:
    name: str
    api_key: str
    webhook_secret: str


def client_create(
    *, name: str, webhook_url: str, is_operator: bool, may_send_critical: bool = False
) -> NewClient:
    """Creates a client with one API key; the plain key exists only in the return value."""
    try:
        with transaction.atomic():
            client = Client.objects.create(
                name=name,
                webhook_url=webhook_url,
                is_operator=is_operator,
                may_send_critical=may_send_critical,
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


def client_for_api_key(key: str) -> Client | None:
    """The client whose usable (not revoked, not expired) key this is, or None."""
    try:
        api_key = ClientAPIKey.objects.get_from_key(key)
    except ClientAPIKey.DoesNotExist:
        return None
    return None if api_key.has_expired else api_key.client


@dataclass(frozen=True)
class RequestCount:
    requests: int
    """Requests of the client in the current window, this one included."""
    seconds_left: float
    """Until the window ends and the count starts again."""


def client_request_count(*, client_id: uuid.UUID, window_s: float, count: int = 1) -> RequestCount:
    """Counts `count` requests of the client in its current window (clients/sql/clients.sql);
    `requests` then includes them."""
    return SQL.row(
        "client_request_count",
        row=RequestCount,
        client_id=client_id,
        window_s=window_s,
        count=count,
    )


@dataclass(frozen=True)
class KeyRow:
    """An unrevoked API key found by its prefix, with its client's id and flags."""

    key_id: str
    hashed_key: str
    expired: bool
    client_id: uuid.UUID
    client_name: str
    is_operator: bool
    may_send_critical: bool


def api_key_row(*, prefix: str) -> KeyRow | None:
    """The unrevoked key with this prefix and its client's flags, in one query; None if there
    is none. Nothing is cached: a revoked or expired key fails on its next request."""
    return SQL.row("api_key_client", row=KeyRow, prefix=prefix)


def key_client(row: KeyRow) -> Client:
    """The client of a key `api_key_row` found, with only the fields the API reads on every
    request loaded (`id`, `name`, `is_operator`, `may_send_critical`); others load on first
    use."""
    return Client.from_db(
        "default",
        ["id", "name", "is_operator", "may_send_critical"],
        [row.client_id, row.client_name, row.is_operator, row.may_send_critical],
    )


def client_key_authenticates(*, name: str, api_key: str) -> bool:
    """True when `api_key` is a usable (not revoked, not expired) key of the client `name`."""
    try:
        key = ClientAPIKey.objects.get_from_key(api_key)
    except ClientAPIKey.DoesNotExist:
        return False
    return not key.has_expired and key.client.name == name


def client_webhook_url_set(*, name: str, webhook_url: str) -> None:
    """Points the client `name`'s webhooks at `webhook_url` (empty: sends none). The caller
    has checked the URL (development points it at loopback, which validation refuses)."""
    Client.objects.filter(name=name).update(webhook_url=webhook_url)


def client_operator_grant(*, name: str) -> None:
    """Makes the client `name` an operator (it may retry any client's notifications)."""
    Client.objects.filter(name=name).update(is_operator=True)
