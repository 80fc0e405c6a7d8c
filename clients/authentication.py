"""`Authorization: Api-Key <key>` authentication for every /api/v1/ call."""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

from rest_framework import authentication, exceptions
from rest_framework.request import Request

from clients.models import Client, ClientAPIKey

if TYPE_CHECKING:
    from clients.repositories import KeyRow

KEYWORD = "Api-Key"
# Keys this process authenticated, by prefix: which client a key belongs to never changes, but
# whether it is still usable does, so a remembered key is only a hint for a statement that
# checks it again (notifications/ingest.py). Bounded: emptied when full.
_REMEMBERED: dict[str, KeyRow] = {}
REMEMBERED_MAX = 10_000
# What a key with an unknown prefix is checked against (see _key_verified): the hash of a key
# no client has, in the preferred hasher's format.
_UNKNOWN_PREFIX_HASH = ClientAPIKey.objects.key_generator.hash("unknown." + "0" * 32)


def api_key_from_header(header: str) -> str | None:
    """The key in an `Authorization` header value, or None when it is not `Api-Key <key>`."""
    keyword, _, key = header.partition(" ")
    key = key.strip()
    if keyword != KEYWORD or not key:
        return None
    return key


def api_key_authenticate(header: str | None) -> KeyRow:
    """The usable key (known, not revoked, not expired) that `header`, an `Authorization`
    value, names, with its client's flags; raises the 401 of the API otherwise:
    `NotAuthenticated` without a header, `AuthenticationFailed` with the reason. One query;
    nothing is cached, so a revoked or expired key fails on its next request. The key is
    remembered for `remembered_key`. Every authentication of the API is this function, DRF's
    (`ApiKeyAuthentication`) and the thin create path's (notifications/ingest.py)."""
    if not header:
        raise exceptions.NotAuthenticated()
    key = api_key_from_header(header)
    if key is None:
        raise exceptions.AuthenticationFailed("Expected 'Authorization: Api-Key <key>'.")
    # Imported here: DRF imports this module while notifyqueue.errors (which the
    # repositories import) is still importing DRF.
    from clients.repositories import api_key_row

    prefix = key.partition(".")[0]
    row = api_key_row(prefix=prefix)
    if not _key_verified(key, row.hashed_key if row else None) or row is None:
        raise exceptions.AuthenticationFailed("Unknown or revoked API key.")
    if row.expired:
        raise exceptions.AuthenticationFailed("This API key has expired.")
    if len(_REMEMBERED) >= REMEMBERED_MAX:
        _REMEMBERED.clear()
    _REMEMBERED[prefix] = row
    return row


def _key_verified(key: str, hashed_key: str | None) -> bool:
    """Whether `key` matches `hashed_key`. For a prefix no key has (None), a made-up hash is
    checked all the same, so an unknown prefix and a wrong secret cost the same work: the
    answer's timing does not tell which prefixes exist. The secret itself is compared as a
    SHA-512 hash in constant time (djangorestframework-api-key's hasher)."""
    generator = ClientAPIKey.objects.key_generator
    if hashed_key is None:
        generator.verify(key, _UNKNOWN_PREFIX_HASH)
        return False
    return generator.verify(key, hashed_key)


def remembered_key(header: str | None) -> tuple[str, KeyRow] | None:
    """The prefix and row of the key `header` names, if `api_key_authenticate` accepted that
    key before in this process (its hash is the one the table stored then); no query. Whether
    the key is still usable is NOT known: only for a statement that checks the key itself
    (`notification_create_checked`)."""
    if not header or not header.isascii():
        return None
    key = api_key_from_header(header)
    if key is None:
        return None
    prefix = key.partition(".")[0]
    row = _REMEMBERED.get(prefix)
    generator = ClientAPIKey.objects.key_generator
    if row is None or not generator.using_preferred_hasher(row.hashed_key):
        return None
    if not hmac.compare_digest(generator.preferred_hasher.encode(key, ""), row.hashed_key):
        return None
    return prefix, row


def forget_key(prefix: str) -> None:
    """Drops a remembered key (its create statement found it no longer usable, or so it may
    be): the next request looks it up again."""
    _REMEMBERED.pop(prefix, None)


class ApiKeyAuthentication(authentication.BaseAuthentication):
    """Authenticates the request as a `Client`; `request.user` is that client, `request.auth`
    its key's row."""

    def authenticate(self, request: Request) -> tuple[Client, KeyRow] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None  # DRF's permission check answers NotAuthenticated
        # Imported here: see api_key_authenticate.
        from clients.repositories import key_client

        row = api_key_authenticate(header)
        return key_client(row), row

    def authenticate_header(self, request: Request) -> str:
        # Makes DRF answer 401 (not 403) when the key is missing or wrong.
        return KEYWORD
