"""The delivery rules, free of the database: how a provider's answer ends an attempt.

Invariants decided here:
- a temporary failure retries after exponential backoff with jitter, until the channel's
  attempts are used up; then the notification moves to its next usable fallback channel
  (re-rendered, attempts reset, due now) and is dead-lettered only when none is left;
- a permanent rejection moves to the next usable fallback too, and fails the notification
  when there is none;
- a preference-mode notification (one with a user id) is re-checked before every send: a
  channel the user no longer allows is never sent on; the notification moves to the next
  allowed fallback, or is SUPPRESSED when none is left, without using an attempt;
- a notification whose address is on the suppression list is never sent: it moves to the
  user's next allowed fallback, or is SUPPRESSED (`suppressed: <reason>`), without using an
  attempt;
- a claim given back unstarted (shutdown) returns its attempt and keeps its due time;
- a claim past its expiry is never sent: it ends EXPIRED with its attempt given back.
"""

from __future__ import annotations

import dataclasses
import random
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from delivery.models import Outcome
from delivery.providers.base import Accepted, PermanentFailure, ProviderResult, TemporaryFailure
from delivery.repositories import Claim, Finish
from notifications.models import Status
from notifyqueue.backoff import jittered
from preferences.routing import Route, SendRoutes
from suppressions.services import suppression_reason_text


@dataclass(frozen=True)
class RetryPolicy:
    base_s: float
    max_s: float

    def delay_s(self, failed_attempt: int, rng: random.Random) -> float:
        """Wait after the n-th failed attempt: uniform in [d, 2d] with d = base * 2^(n-1),
        never more than max_s. Attempt 1 waits 0.5-1 s at the default base of 0.5 s.
        (Webhooks keep their own fixed schedule; only the jitter is shared: notifyqueue.backoff.)"""
        d = self.base_s * 2 ** (failed_attempt - 1)
        return min(jittered(d, low=1.0, high=2.0, rng=rng.random), self.max_s)


class Router(Protocol):
    """Reads users' current preferences (and templates) for the worker."""

    def routes_at_send(self, claims: Sequence[Claim]) -> Mapping[uuid.UUID, SendRoutes]:
        """Each preference-mode claim's routes now (by its id), read for the whole claim at
        once."""

    def route_next(self, claim: Claim) -> Route | None:
        """The first of the claim's fallbacks allowed now, rendered for it; None if none is."""


def claim_recheck(claim: Claim, routes: SendRoutes) -> Claim | Finish:
    """Before a preference-mode send, given what the user's current preferences allow
    (`Router.routes_at_send`): the claim to send (at the user's current address), or the Finish
    that moves it to a fallback or SUPPRESSED. Nothing is sent in the latter case, so the
    attempt is given back (a switch resets the count anyway)."""
    if routes.current is not None:
        return dataclasses.replace(claim, recipient=routes.current.recipient)
    reason = f"{claim.channel} is no longer allowed by the user's preferences"
    switch = routes.fallback
    if switch is None:
        return Finish(
            claim.id,
            claim.claim_token,
            Status.SUPPRESSED,
            Outcome.SUPPRESSED,
            error=f"suppressed: {reason} and no fallback channel is",
            attempt_delta=-1,
        )
    return _switch(claim, switch, Outcome.REROUTED, f"{reason}; switched to {switch.channel}")


def claim_suppress(claim: Claim, *, reason: str, router: Router) -> Finish:
    """A claim whose address is on the suppression list: moved to the user's next channel
    when one remains (as a preference that no longer allows the channel), else SUPPRESSED.
    Nothing is sent, so the attempt is given back."""
    error = suppression_reason_text(reason)
    switch = router.route_next(claim) if claim.fallback_channels else None
    if switch is None:
        return Finish(
            claim.id,
            claim.claim_token,
            Status.SUPPRESSED,
            Outcome.SUPPRESSED,
            error=error,
            attempt_delta=-1,
        )
    return _switch(claim, switch, Outcome.SUPPRESSED, f"{error}; switched to {switch.channel}")


def attempt_finish(
    claim: Claim,
    result: ProviderResult,
    *,
    policy: RetryPolicy,
    rng: random.Random,
    router: Router | None = None,
) -> Finish:
    """Turns a provider's answer into the row's next state. `router` is asked for a fallback
    only when this channel is done with (rejected, or out of attempts) and fallbacks remain."""

    def fallback() -> Route | None:
        return router.route_next(claim) if router and claim.fallback_channels else None

    def ends(status: str, outcome: str, **fields) -> Finish:
        return Finish(
            claim.id, claim.claim_token, status, outcome, recipient=_recipient(claim), **fields
        )

    match result:
        case Accepted(message_id):
            return ends(Status.SENT, Outcome.SENT, message_id=message_id)
        case PermanentFailure(error):
            if switch := fallback():
                return _switch(claim, switch, Outcome.PERMANENT_FAILURE, error)
            return ends(Status.FAILED, Outcome.PERMANENT_FAILURE, error=error)
        case TemporaryFailure(error) if claim.attempt_count >= claim.max_attempts:
            if switch := fallback():
                return _switch(claim, switch, Outcome.TEMPORARY_FAILURE, error)
            return ends(Status.DEAD_LETTERED, Outcome.TEMPORARY_FAILURE, error=error)
        case TemporaryFailure(error):
            return ends(
                Status.PENDING,
                Outcome.TEMPORARY_FAILURE,
                error=error,
                delay_s=policy.delay_s(claim.attempt_count, rng),
            )
    raise TypeError(f"not a provider result: {result!r}")


def _switch(claim: Claim, route: Route, outcome: str, error: str) -> Finish:
    """Moves the row to `route`'s channel: PENDING, due now, attempts reset to 0."""
    return Finish(
        claim.id,
        claim.claim_token,
        Status.PENDING,
        outcome,
        error=error,
        delay_s=0.0,
        channel=route.channel,
        recipient=route.recipient,
        subject=route.subject,
        body=route.body,
        fallback_channels=route.fallback_channels,
        attempt_reset=True,
    )


def _recipient(claim: Claim) -> str | None:
    """A preference-mode claim's address as the re-check found it (the user may have changed
    it while the notification waited); None keeps the stored one."""
    return claim.recipient if claim.user_id is not None else None


def claim_release(claim: Claim) -> Finish:
    """Gives an unstarted claim back: PENDING again, its attempt returned, due as before."""
    return Finish(claim.id, claim.claim_token, Status.PENDING, Outcome.RELEASED, attempt_delta=-1)


def claim_expired(claim: Claim) -> Finish:
    """A claim whose expiry passed before its send started: EXPIRED, final, never sent; the
    attempt is given back (the provider was never asked)."""
    return Finish(
        claim.id,
        claim.claim_token,
        Status.EXPIRED,
        Outcome.EXPIRED,
        error="expired: not sent by its expires_at",
        attempt_delta=-1,
    )
