"""The rate-limit rule: at most `limit` deliveries per recipient in any rolling window.

Over the limit means wait, not fail: the notification is deferred with its attempt given
back. CRITICAL notifications are never held back, but they are counted.
"""

from __future__ import annotations

from dataclasses import dataclass

from delivery.repositories import Claim
from notifyqueue.vocabulary import Priority
from ratelimits.repositories import Admission, RateLimitRepository


@dataclass(frozen=True)
class RateLimit:
    limit: int
    window_s: float


def recipient_admit(
    claim: Claim, *, rate_limit: RateLimit, repository: RateLimitRepository
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
