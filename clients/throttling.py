"""The API's per-client request throttle: 429 with Retry-After past the configured rate.

Counted in PostgreSQL (one row per client, one statement per request), not in process memory,
because the API runs as several processes and hosts: a client's requests are counted once
whichever process serves them. `NOTIFYQUEUE_API_RATE_LIMIT` requests per
`NOTIFYQUEUE_API_RATE_LIMIT_WINDOW_SECONDS` fixed window; 0 turns the throttle off.
Unauthenticated requests are not counted (they are refused with 401 before any query but the
key lookup).
"""

from __future__ import annotations

import uuid

from django.conf import settings
from rest_framework.throttling import BaseThrottle

from clients.models import Client
from clients.repositories import client_request_count


def request_refused(client_id: uuid.UUID) -> float | None:
    """Counts one request of the client; the seconds it must wait when this request is over
    the limit, None when it may go on (or the throttle is off)."""
    limit = settings.NOTIFYQUEUE_API_RATE_LIMIT
    if limit <= 0:
        return None
    count = client_request_count(
        client_id=client_id, window_s=settings.NOTIFYQUEUE_API_RATE_LIMIT_WINDOW_SECONDS
    )
    if count.requests <= limit:
        return None
    return max(count.seconds_left, 0.001)


class ClientRequestThrottle(BaseThrottle):
    def __init__(self) -> None:
        self.seconds_left: float | None = None

    def allow_request(self, request, view) -> bool:
        client = request.user
        if settings.NOTIFYQUEUE_API_RATE_LIMIT <= 0 or not isinstance(client, Client):
            return True
        self.seconds_left = request_refused(client.id)
        return self.seconds_left is None

    def wait(self) -> float | None:
        # DRF rounds this up to whole seconds for the Retry-After header.
        return self.seconds_left
