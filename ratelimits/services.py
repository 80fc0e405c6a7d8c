"""The rate-limit rule: at most `limit` deliveries per recipient in any rolling window.

Over the limit means wait, not fail: the notification is deferred with its attempt given
back. CRITICAL notifications are never held back, but they are counted.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Protocol

from notifyqueue.vocabulary import Priority
from ratelimits.repositories import Admission, RateLimitRepository


@dataclass(frozen=True)
class RateLimit:
    limit: int
    window_s: float


class Admittable(Protocol):
    """What the rule reads of a claimed notification (the worker's `Claim` is one); a
    Protocol, so this app never imports the worker's types (docs/technical-design.md, Layers).
    """

    @property
    def id(self) -> uuid.UUID: ...
    @property
    def claim_token(self) -> uuid.UUID: ...
    @property
    def client_id(self) -> uuid.UUID: ...
    @property
    def channel(self) -> str: ...
    @property
    def recipient(self) -> str: ...
    @property
    def priority(self) -> int: ...


def recipient_admit(
    claim: Admittable, *, rate_limit: RateLimit, repository: RateLimitRepository
) -> Admission:
    return repository.recipient_admit(
        channel=claim.channel,
        client_id=claim.client_id,
        recipient=claim.recipient,
        notification_id=claim.id,
        claim_token=claim.claim_token,
        critical=claim.priority == Priority.CRITICAL,
        limit=rate_limit.limit,
        window_s=rate_limit.window_s,
    )
