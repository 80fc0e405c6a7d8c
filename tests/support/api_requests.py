"""Creates sent as a client would, for the tests that try the create endpoints' bounds."""

from __future__ import annotations

from rest_framework.test import APIClient

URL = "/api/v1/notifications"
VALID = {"channel": "email", "recipient": "ada@example.com", "subject": "Hi", "body": "Welcome"}


def create(http: APIClient, body, key: str = "key-1"):
    return http.post(URL, body, format="json", HTTP_IDEMPOTENCY_KEY=key)


def create_raw(http: APIClient, text: str, key: str = "key-1"):
    return http.generic(
        "POST", URL, text, content_type="application/json", HTTP_IDEMPOTENCY_KEY=key
    )
