"""The delivery rules, free of the database: how a provider's answer ends an attempt.

Invariants decided here:
- a temporary failure retries after exponential backoff with jitter, until the channel's
  attempts are used up, then the notification is dead-lettered;
- a permanent rejection fails the notification at once;
- a claim given back unstarted (shutdown) returns its attempt and keeps its due time.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta

from delivery.models import Outcome
from delivery.providers.base import Accepted, PermanentFailure, ProviderResult, TemporaryFailure
from delivery.repositories import Claim, Finish
from notifications.models import Status


@dataclass(frozen=True)
class RetryPolicy:
    base_s: float
    max_s: float

    def delay_s(self, failed_attempt: int, rng: random.Random) -> float:
        """Wait after the n-th failed attempt: uniform in [d, 2d] with d = base * 2^(n-1),
        never more than max_s. Attempt 1 waits 0.5-1 s at the default base of 0.5 s."""
        low = self.base_s * 2 ** (failed_attempt - 1)
        return min(rng.uniform(low, 2 * low), self.max_s)


def attempt_finish(
    claim: Claim,
    result: ProviderResult,
    *,
    now: datetime,
    policy: RetryPolicy,
    rng: random.Random,
) -> Finish:
    """Turns a provider's answer into the row's next state."""
    match result:
        case Accepted(message_id):
            return Finish(
                claim.id, claim.claim_token, Status.SENT, Outcome.SENT, message_id=message_id
            )
        case PermanentFailure(error):
            return Finish(
                claim.id, claim.claim_token, Status.FAILED, Outcome.PERMANENT_FAILURE, error=error
            )
        case TemporaryFailure(error) if claim.attempt_count >= claim.max_attempts:
            return Finish(
                claim.id,
                claim.claim_token,
                Status.DEAD_LETTERED,
                Outcome.TEMPORARY_FAILURE,
                error=error,
            )
        case TemporaryFailure(error):
            delay = policy.delay_s(claim.attempt_count, rng)
            return Finish(
                claim.id,
                claim.claim_token,
                Status.PENDING,
                Outcome.TEMPORARY_FAILURE,
                error=error,
                due_at=now + timedelta(seconds=delay),
            )
    raise TypeError(f"not a provider result: {result!r}")


def claim_release(claim: Claim) -> Finish:
    """Gives an unstarted claim back: PENDING again, its attempt returned, due as before."""
    return Finish(claim.id, claim.claim_token, Status.PENDING, Outcome.RELEASED, attempt_delta=-1)
