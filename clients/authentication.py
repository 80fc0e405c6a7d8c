"""`Authorization: Api-Key <key>` authentication for every /api/v1/ call."""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

from rest_framework import authentication, exceptions
from rest_framework.request import Request

from clients.models import Client, ClientAPIKey

if TYPE_CHECKING:
    from clients.repositories import KeyHolder, KeyRow

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


def usable_key(header: str | None) -> KeyRow | None:
    """The key and its client's flags when `header` (an `Authorization` value) names a usable
    key: known, not revoked, not expired. None for anything else, whatever the reason; the
    thin create path (notifications/ingest.py) then lets `ApiKeyAuthentication` answer.
    One query; nothing is cached."""
    if not header or not header.isascii():
        return None
    key = api_key_from_header(header)
    if key is None:
        return None
    # Imported here: see ApiKeyAuthentication.authenticate.
    from clients.repositories import api_key_row

    prefix = key.partition(".")[0]
    row = api_key_row(prefix=prefix)
    if not _key_verified(key, row.hashed_key if row else None) or row is None or row.expired:
        return None
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
    """The prefix and row of the key `header` names, if `usable_key` accepted that key before
    in this process (its hash is the one the table stored then); no query. Whether the key
    is still usable is NOT known: only for a statement that checks the key itself
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
    """Authenticates the request as a `Client`; `request.user` is that client."""

    def authenticate(self, request: Request) -> tuple[Client, KeyHolder] | None:
        """One query (the key by its prefix, with its client); nothing is cached, so a revoked
        or expired key fails on its next request."""
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        key = api_key_from_header(header)
        if key is None:
            raise exceptions.AuthenticationFailed("Expected 'Authorization: Api-Key <key>'.")
        # Imported here: DRF imports this module while notifyqueue.errors (which the
        # repositories import) is still importing DRF.
        from clients.repositories import api_key_holder

        prefix, _, _ = key.partition(".")
        holder = api_key_holder(prefix=prefix)
        if not _key_verified(key, holder.hashed_key if holder else None) or holder is None:
            raise exceptions.AuthenticationFailed("Unknown or revoked API key.")
        if holder.expired:
            raise exceptions.AuthenticationFailed("This API key has expired.")
        return holder.client, holder

    def authenticate_header(self, request: Request) -> str:
        # Makes DRF answer 401 (not 403) when the key is missing or wrong.
        return KEYWORD
