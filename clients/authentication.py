"""`Authorization: Api-Key <key>` authentication for every /api/v1/ call."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rest_framework import authentication, exceptions
from rest_framework.request import Request

from clients.models import Client, ClientAPIKey

if TYPE_CHECKING:
    from clients.repositories import KeyHolder

KEYWORD = "Api-Key"


class ApiKeyAuthentication(authentication.BaseAuthentication):
    """Authenticates the request as a `Client`; `request.user` is that client."""

    def authenticate(self, request: Request) -> tuple[Client, KeyHolder] | None:
        """One query (the key by its prefix, with its client); nothing is cached, so a revoked
        or expired key fails on its next request."""
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        keyword, _, key = header.partition(" ")
        if keyword != KEYWORD or not key.strip():
            raise exceptions.AuthenticationFailed("Expected 'Authorization: Api-Key <key>'.")
        # Imported here: DRF imports this module while notifyqueue.errors (which the
        # repositories import) is still importing DRF.
        from clients.repositories import api_key_holder

        key = key.strip()
        prefix, _, _ = key.partition(".")
        holder = api_key_holder(prefix=prefix)
        if holder is None or not ClientAPIKey.objects.key_generator.verify(key, holder.hashed_key):
            raise exceptions.AuthenticationFailed("Unknown or revoked API key.")
        if holder.expired:
            raise exceptions.AuthenticationFailed("This API key has expired.")
        return holder.client, holder

    def authenticate_header(self, request: Request) -> str:
        # Makes DRF answer 401 (not 403) when the key is missing or wrong.
        return KEYWORD
