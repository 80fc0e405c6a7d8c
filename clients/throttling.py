"""The API's per-client request throttle: 429 with Retry-After past the configured rate.

`NOTIFYQUEUE_API_RATE_LIMIT` requests per `NOTIFYQUEUE_API_RATE_LIMIT_WINDOW_SECONDS` fixed
window of the database clock; 0 turns the throttle off. Counted in PostgreSQL (one row per
client), not in process memory, because the API runs as several processes and hosts: a
client's requests are counted once whichever process serves them. Unauthenticated requests are
not counted (they are refused with 401 before any query but the key lookup).

Counting every request in that one row made it a hot row that all of a client's requests
waited on, one round trip each. So a process reserves requests in blocks (`RequestBudget`):
one statement adds a block of `block_size(limit)` to the window's count, and the process then
admits that block's requests without a statement, each as the number it has in the window's
count. The guarantee stays exact in the direction that
matters: a request is admitted only if its number in the window is at most the limit, so
**never more than the limit is admitted in a window, over all processes**. What blocks cost
is the other direction: requests a process reserved but did not use are counted all the same,
so a client may be refused once `limit - P x (block - 1)` requests were admitted, with P the
API processes that served it in the window. The block is 1 (every request counted, as
before) for limits under 2,048 a window, one request per 1,024 of the limit above that, and
at most 64: 58 at the default 60,000 a minute, so with 4 API processes no refusal comes before
59,772 requests.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings
from rest_framework.throttling import BaseThrottle

from clients.models import Client
from clients.repositories import RequestCount, client_request_count

BLOCK_MAX = 64
# One block per this many requests of the limit: below it, a block of 1.
BLOCK_SHARE = 1024


def block_size(limit: int) -> int:
    """How many requests a process reserves at once for a client at this limit."""
    return max(1, min(BLOCK_MAX, limit // BLOCK_SHARE))


@dataclass
class _Block:
    next: int  # the window count the next request admitted from this block has
    last: int  # the window count of the block's last request
    ends_at: float  # when the window ends, on this process's monotonic clock


class RequestBudget:
    """A process's reserved blocks of requests, per client. Thread-safe; one per process
    (`BUDGET`), or one per test."""

    def __init__(
        self,
        *,
        count: Callable[..., RequestCount] = client_request_count,
        clock: Callable[[], float] = time.monotonic,
        block: Callable[[int], int] = block_size,
    ) -> None:
        self._count = count
        self._clock = clock
        self._block = block
        self._blocks: dict[uuid.UUID, _Block] = {}
        self._lock = threading.Lock()

    def refused(self, client_id: uuid.UUID, *, limit: int, window_s: float) -> float | None:
        """Admits one request of the client: None, or the seconds until its window ends when
        the request is over the limit."""
        now = self._clock()
        with self._lock:
            answer = self._take(client_id, limit, now)
        if answer is not None:
            return answer or None
        size = self._block(limit)
        counted = self._count(client_id=client_id, window_s=window_s, count=size)
        # This request is the block's first; the others are kept for the next requests.
        number = counted.requests - size + 1
        with self._lock:
            self._blocks[client_id] = _Block(
                number + 1, counted.requests, now + counted.seconds_left
            )
        if number <= limit:
            return None
        return max(counted.seconds_left, 0.001)

    def _take(self, client_id: uuid.UUID, limit: int, now: float) -> float | None:
        """0.0 when the request is admitted from a block, the wait when it is over the limit,
        None when there is no block left to take it from."""
        block = self._blocks.get(client_id)
        if block is None or block.next > block.last or now >= block.ends_at:
            return None
        number = block.next
        block.next += 1
        if number <= limit:
            return 0.0
        return max(block.ends_at - now, 0.001)


BUDGET = RequestBudget()


def request_refused(client_id: uuid.UUID) -> float | None:
    """Counts one request of the client; the seconds it must wait when this request is over
    the limit, None when it may go on (or the throttle is off)."""
    limit = settings.NOTIFYQUEUE_API_RATE_LIMIT
    if limit <= 0:
        return None
    return BUDGET.refused(
        client_id, limit=limit, window_s=settings.NOTIFYQUEUE_API_RATE_LIMIT_WINDOW_SECONDS
    )


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
