"""The rate-limit rule: at most `limit` deliveries per (client, recipient) in any rolling
window, the recipient counted in its normalised form, and with `ceiling` > 0 at most `ceiling`
per address across all clients.

Over the limit means wait, not fail: the notification is deferred with its attempt given
back. CRITICAL notifications are never held back, but they are counted.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Protocol

from notifyqueue.vocabulary import Priority
from ratelimits.repositories import Admission, AdmissionRequest, Admitted, RateLimitRepository


@dataclass(frozen=True)
class RateLimit:
    limit: int
    window_s: float
    # The service-wide ceiling per address across clients; 0 is off.
    ceiling: int = 0


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


def recipients_admit(
    claims: list[Admittable], *, rate_limit: RateLimit, repository: RateLimitRepository
) -> dict[uuid.UUID, Admission]:
    """Each claimed row's admission. The whole claim is admitted in one statement; only a row
    whose key was at its limit then takes a round trip of its own, to check again under its
    key's lock and defer (see `recipient_admit`)."""
    admitted = repository.recipients_admit(
        claims=[_request(claim) for claim in claims],
        limit=rate_limit.limit,
        window_s=rate_limit.window_s,
        ceiling=rate_limit.ceiling,
    )
    return {
        claim.id: Admitted()
        if claim.id in admitted
        else recipient_admit(claim, rate_limit=rate_limit, repository=repository)
        for claim in claims
    }


def recipient_admit(
    claim: Admittable, *, rate_limit: RateLimit, repository: RateLimitRepository
) -> Admission:
    request = _request(claim)
    return repository.recipient_admit(
        channel=request.channel,
        client_id=request.client_id,
        recipient=request.recipient,
        notification_id=request.notification_id,
        claim_token=request.claim_token,
        critical=request.critical,
        limit=rate_limit.limit,
        window_s=rate_limit.window_s,
        ceiling=rate_limit.ceiling,
    )


def _request(claim: Admittable) -> AdmissionRequest:
    return AdmissionRequest(
        channel=claim.channel,
        client_id=claim.client_id,
        recipient=claim.recipient,
        notification_id=claim.id,
        claim_token=claim.claim_token,
        critical=claim.priority == Priority.CRITICAL,
    )
