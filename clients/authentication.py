"""`Authorization: Api-Key <key>` authentication for every /api/v1/ call."""

from __future__ import annotations

from rest_framework import authentication, exceptions
from rest_framework.request import Request

from clients.models import Client, ClientAPIKey

KEYWORD = "Api-Key"


class ApiKeyAuthentication(authentication.BaseAuthentication):
    """Authenticates the request as a `Client`; `request.user` is that client."""

    def authenticate(self, request: Request) -> tuple[Client, ClientAPIKey] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        keyword, _, key = header.partition(" ")
        if keyword != KEYWORD or not key.strip():
            raise exceptions.AuthenticationFailed("Expected 'Authorization: Api-Key <key>'.")
        try:
            api_key = ClientAPIKey.objects.get_from_key(key.strip())
        except ClientAPIKey.DoesNotExist as exc:
            raise exceptions.AuthenticationFailed("Unknown or revoked API key.") from exc
        if api_key.has_expired:
            raise exceptions.AuthenticationFailed("This API key has expired.")
        return api_key.client, api_key

    def authenticate_header(self, request: Request) -> str:
        # Makes DRF answer 401 (not 403) when the key is missing or wrong.
        return KEYWORD
