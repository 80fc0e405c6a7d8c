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

# Rows of the client's due range (per priority) a deferral looks through for the key's rows
# in the way, beyond the claimed ones: what one deferral may read and move, whatever the
# backlog. A backlog of B due rows in front of the client's other recipients leaves their way
# in at most ceil(B / DEFER_AHEAD_ROWS) deferrals.
DEFER_AHEAD_ROWS = 1000


@dataclass(frozen=True)
class RateLimit:
    limit: int
    window_s: float
    # The service-wide ceiling per address across clients; 0 is off.
    ceiling: int = 0
    defer_ahead: int = DEFER_AHEAD_ROWS


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
    """Each claimed row's admission. The whole claim is admitted in one statement; the rows
    whose keys were at their limits are then checked again under their keys' locks and the
    rest deferred, all of them in one transaction of two statements (see
    `RateLimitRepository.recipients_defer`): however many over-limit rows a claim holds, and
    of however many keys, one deferral."""
    requests = [_request(claim) for claim in claims]
    admitted = repository.recipients_admit(
        claims=requests,
        limit=rate_limit.limit,
        window_s=rate_limit.window_s,
        ceiling=rate_limit.ceiling,
    )
    settled = repository.recipients_defer(
        claims=[r for r in requests if r.notification_id not in admitted],
        limit=rate_limit.limit,
        window_s=rate_limit.window_s,
        ceiling=rate_limit.ceiling,
        ahead=rate_limit.defer_ahead,
    )
    return {claim.id: Admitted() if claim.id in admitted else settled[claim.id] for claim in claims}


def recipient_admit(
    claim: Admittable, *, rate_limit: RateLimit, repository: RateLimitRepository
) -> Admission:
    return recipients_admit([claim], rate_limit=rate_limit, repository=repository)[claim.id]


def _request(claim: Admittable) -> AdmissionRequest:
    return AdmissionRequest(
        channel=claim.channel,
        client_id=claim.client_id,
        recipient=claim.recipient,
        notification_id=claim.id,
        claim_token=claim.claim_token,
        critical=claim.priority == Priority.CRITICAL,
    )
