"""The send-time checks: what a claimed notification passes between its claim and its
provider call, one stage each, in the contract's order (preferences, suppression, expiry,
quiet hours, rate limit, circuit, send).
Between the circuit and the send, the worker marks the sends of claims that carry an expiry
or a cancellation key started, in one statement (`Worker._send_start`): a claim cancelled or
expired by then is not sent.

Every stage but the circuit takes the claims that passed the one before and returns those
that go on, each other one having ended here: its result handed to `end` (to be recorded with
the step's others) or, for a database error, to `fail` (a failed attempt, nothing sent); the
quiet-hours holds and the rate limit's deferrals are settled by their own statements. A new
check is one more stage in `send_checks_build`, at its place in that order. The circuit comes
last and per claim, just before its call, as its half-open probe admits the very call that
follows it (`CircuitStage`); a claim it refuses is held, its attempt given back, with the
step's other refusals in one statement (the worker's `_record_holds`).

Invariants: the preferences, the quiet hours and the rate limit each decide the whole claim
in one statement (the preferences in two when fallbacks need their templates; a row at a time
only after that failed), and the suppression list reads it in one; a stage costs nothing per
claim that it does not concern; no stage holds a lock or a transaction open after it returns;
a claim held by quiet hours or deferred by the rate limit uses no attempt.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from typing import Protocol

from django.db import DatabaseError

from delivery.circuits.services import Allowed, Circuit, Refused
from delivery.repositories import Claim, Finish, QuietHeld
from delivery.services import Router, claim_expired, claim_recheck, claim_suppress
from delivery.upkeep import WindowPruner
from monitoring.metrics import DELIVERY as metrics
from notifyqueue.addresses import recipient_key
from notifyqueue.vocabulary import Priority
from preferences.routing import SendRoutes
from ratelimits.repositories import Admitted, Deferred, RateLimitRepository
from ratelimits.services import RateLimit, recipients_admit
from suppressions.repositories import AddressCheck, SuppressionRepository

log = logging.getLogger("notifyqueue.delivery")

# What a stage does with a claim that ends in it.
End = Callable[[Finish], None]
Fail = Callable[[Claim, DatabaseError], None]


class ClaimStage(Protocol):
    def passing(self, claims: list[Claim]) -> list[Claim]:
        """The claims that go on to the next stage, in their order; each of the others ended
        here."""
        ...


class QuietHolds(Protocol):
    """What the quiet-hours stage asks of the database (`DeliveryRepository` is one)."""

    def notification_quiet_hold(self, claims: list[Claim]) -> list[QuietHeld]: ...


class SendChecks:
    """The stages before the circuit, run in order over a whole claim."""

    def __init__(self, stages: Sequence[ClaimStage]) -> None:
        self.stages = tuple(stages)

    def passing(self, claims: list[Claim]) -> list[Claim]:
        for stage in self.stages:
            claims = stage.passing(claims)
        return claims


class PreferencesStage:
    """A preference-mode claim is checked against the user's current preferences: sent
    (possibly at a new address), or ended here (switched to a fallback or SUPPRESSED). The
    users of the whole claim are read at once (`Router.routes_at_send`); claims with no user
    pass untouched and cost nothing here."""

    def __init__(self, *, router: Router, end: End, fail: Fail, worker_id: str) -> None:
        self.router = router
        self.end = end
        self.fail = fail
        self.worker_id = worker_id

    def passing(self, claims: list[Claim]) -> list[Claim]:
        concerned = [claim for claim in claims if claim.user_id is not None]
        if not concerned:
            return claims
        try:
            routes = dict(self.router.routes_at_send(concerned))
        except DatabaseError as exc:
            routes = self._route_one_by_one(concerned, exc)
        passing = []
        for claim in claims:
            if claim.user_id is None:
                passing.append(claim)
            elif claim.id in routes:
                rechecked = self._recheck(claim, routes[claim.id])
                if rechecked is not None:
                    passing.append(rechecked)
        return passing

    def _recheck(self, claim: Claim, routes: SendRoutes) -> Claim | None:
        rechecked = claim_recheck(claim, routes)
        if isinstance(rechecked, Finish):
            log.debug(
                "preferences changed notification=%s client=%s channel=%s status=%s "
                "next_channel=%s worker=%s",
                claim.id,
                claim.client_id,
                claim.channel,
                rechecked.status,
                rechecked.channel,
                self.worker_id,
            )
            self.end(rechecked)
            return None
        return rechecked

    def _route_one_by_one(
        self, claims: list[Claim], exc: DatabaseError
    ) -> dict[uuid.UUID, SendRoutes]:
        """After the claim's read failed (a passing error): each claim on its own, so one bad
        row costs only its own attempt; a claim whose read fails alone too is a failed attempt,
        nothing sent, and has no routes here."""
        if len(claims) == 1:
            self.fail(claims[0], exc)
            return {}
        log.warning("preferences of a claim of %d unreadable (%r); one by one", len(claims), exc)
        routes: dict[uuid.UUID, SendRoutes] = {}
        for claim in claims:
            try:
                routes |= self.router.routes_at_send([claim])
            except DatabaseError as row_exc:
                self.fail(claim, row_exc)
        return routes


class SuppressionStage:
    """The claims whose address (as the preferences stage left it, in its counting form) is
    on the suppression list, for their client or for every client, end here: moved to the
    user's next channel when there is one, else SUPPRESSED with `suppressed: <reason>`;
    never sent. One statement for the whole claim."""

    def __init__(
        self,
        *,
        repository: SuppressionRepository,
        router: Router,
        end: End,
        fail: Fail,
        worker_id: str,
    ) -> None:
        self.repository = repository
        self.router = router
        self.end = end
        self.fail = fail
        self.worker_id = worker_id

    def passing(self, claims: list[Claim]) -> list[Claim]:
        if not claims:
            return claims
        checks = [
            AddressCheck(c.id, c.client_id, c.channel, recipient_key(c.channel, c.recipient))
            for c in claims
        ]
        try:
            suppressed = self.repository.matches(checks)
        except DatabaseError as exc:
            # Without the list, nothing may be sent that it might stop: each claim is a failed
            # attempt, retried later (as a rate limit that cannot be read fails its claims).
            for claim in claims:
                self.fail(claim, exc)
            return []
        passing = []
        for claim in claims:
            reason = suppressed.get(claim.id)
            if reason is None:
                passing.append(claim)
                continue
            try:
                finish = claim_suppress(claim, reason=reason, router=self.router)
            except DatabaseError as exc:
                self.fail(claim, exc)
                continue
            metrics.suppressed(channel=claim.channel, reason=reason)
            log.info(
                "suppressed notification=%s client=%s channel=%s reason=%s status=%s "
                "next_channel=%s worker=%s",
                claim.id,
                claim.client_id,
                claim.channel,
                reason,
                finish.status,
                finish.channel,
                self.worker_id,
            )
            self.end(finish)
        return passing


class ExpiryStage:
    """A claim already past its expiry when claimed (by the database clock: the claim
    answers the seconds left) ends here EXPIRED, never sent. One that expires later, before
    its send starts, is caught by the last check before the provider call
    (`notification_send_start`); a waiting one by the upkeep (`upkeep.ExpiryFinisher`)."""

    def __init__(self, *, end: End, worker_id: str) -> None:
        self.end = end
        self.worker_id = worker_id

    def passing(self, claims: list[Claim]) -> list[Claim]:
        passing = []
        for claim in claims:
            if claim.expires_in_s is not None and claim.expires_in_s <= 0:
                log.debug(
                    "expired notification=%s client=%s channel=%s outcome=EXPIRED worker=%s",
                    claim.id,
                    claim.client_id,
                    claim.channel,
                    self.worker_id,
                )
                self.end(claim_expired(claim))
            else:
                passing.append(claim)
        return passing


class QuietHoursStage:
    """A claim for a user (preference mode) that falls inside one of the user's quiet-hours
    windows is held: given back PENDING, its attempt returned, due at the window's end in the
    user's time zone, all decided in PostgreSQL by its clock and time zone database
    (`notification_quiet_hold_many`). CRITICAL claims and claims with no user pass untouched
    and cost nothing here."""

    def __init__(
        self,
        *,
        repository: QuietHolds,
        fail: Fail,
        held: Callable[[Claim, QuietHeld], None],
    ) -> None:
        self.repository = repository
        self.fail = fail
        self.held = held

    def passing(self, claims: list[Claim]) -> list[Claim]:
        concerned = [
            claim
            for claim in claims
            if claim.user_id is not None and claim.priority != Priority.CRITICAL
        ]
        if not concerned:
            return claims
        try:
            held = self.repository.notification_quiet_hold(concerned)
            failed: set[uuid.UUID] = set()
        except DatabaseError as exc:
            held, failed = self._hold_one_by_one(concerned, exc)
        by_id = {claim.id: claim for claim in concerned}
        for row in held:
            self.held(by_id[row.id], row)
        ended = failed | {row.id for row in held}
        return [claim for claim in claims if claim.id not in ended]

    def _hold_one_by_one(
        self, claims: list[Claim], exc: DatabaseError
    ) -> tuple[list[QuietHeld], set[uuid.UUID]]:
        """After the claim's statement failed (a passing error, or a user's zone the server no
        longer knows): each claim on its own, so one bad row costs only its own attempt (a
        failed attempt, nothing sent). The held rows, and the ids of the claims that failed."""
        if len(claims) == 1:
            self.fail(claims[0], exc)
            return [], {claims[0].id}
        log.warning("quiet hours of a claim of %d failed (%r); one by one", len(claims), exc)
        held: list[QuietHeld] = []
        failed: set[uuid.UUID] = set()
        for claim in claims:
            try:
                held += self.repository.notification_quiet_hold([claim])
            except DatabaseError as row_exc:
                self.fail(claim, row_exc)
                failed.add(claim.id)
        return held, failed


class RateLimitStage:
    """The claims the recipients' rate limits admit, in one statement for the claim; the
    others were deferred (settled in the database) or lost their claim meanwhile."""

    def __init__(
        self,
        *,
        rate_limit: RateLimit,
        repository: RateLimitRepository,
        pruner: WindowPruner,
        fail: Fail,
        deferred: Callable[[], None],
        worker_id: str,
    ) -> None:
        self.rate_limit = rate_limit
        self.repository = repository
        self.pruner = pruner
        self.fail = fail
        self.deferred = deferred
        self.worker_id = worker_id

    def passing(self, claims: list[Claim]) -> list[Claim]:
        if not claims:
            return claims
        try:
            admissions = recipients_admit(
                claims, rate_limit=self.rate_limit, repository=self.repository
            )
        except DatabaseError as exc:
            admissions = self._admit_one_by_one(claims, exc)
        admitted = []
        for claim in claims:
            admission = admissions.get(claim.id)
            if isinstance(admission, Admitted):
                admitted.append(claim)
            elif isinstance(admission, Deferred):
                self.deferred()
                metrics.rate_limit_deferred(channel=claim.channel)
                log.debug(
                    "rate limited notification=%s client=%s channel=%s attempt=%d "
                    "outcome=RATE_LIMITED status=PENDING due_at=%s worker=%s",
                    claim.id,
                    claim.client_id,
                    claim.channel,
                    claim.attempt_count,
                    admission.due_at.isoformat(),
                    self.worker_id,
                )
        self.pruner.admitted += len(admitted)
        return admitted

    def _admit_one_by_one(self, claims: list[Claim], exc: DatabaseError) -> dict:
        """After the claim's admission failed: a passing error (a deadlock, a lock timeout) or
        one bad row must not cost every row of the claim an attempt, so each is admitted on its
        own, as the finish does; a row that fails alone too is a failed attempt."""
        if len(claims) == 1:
            self.fail(claims[0], exc)
            return {}
        log.warning("admission of a claim of %d failed (%r); one by one", len(claims), exc)
        admissions = {}
        for claim in claims:
            try:
                admissions |= recipients_admit(
                    [claim], rate_limit=self.rate_limit, repository=self.repository
                )
            except DatabaseError as row_exc:
                self.fail(claim, row_exc)
        return admissions


class CircuitStage:
    """The provider's circuit breaker, asked per claim just before its call: a half-open
    circuit's probe admits the call that follows, so nothing may come between them."""

    def __init__(self, circuits: dict[str, Circuit]) -> None:
        self.circuits = circuits

    def admit(self, channel: str) -> Allowed | Refused | None:
        """None when the channel has no circuit, or its state cannot be read."""
        circuit = self.circuits.get(channel)
        if circuit is None:
            return None
        try:
            return circuit.admit()
        except DatabaseError:
            # The breaker is an optimisation; without its state, call the provider.
            log.exception("circuit %s unreadable; calling the provider", circuit.name)
            return None


def send_checks_build(
    *,
    router: Router,
    repository: QuietHolds,
    quiet_held: Callable[[Claim, QuietHeld], None],
    suppressions: SuppressionRepository,
    rate_limit: RateLimit | None,
    rate_limits: RateLimitRepository,
    pruner: WindowPruner | None,
    end: End,
    fail: Fail,
    deferred: Callable[[], None],
    worker_id: str,
) -> SendChecks:
    """The stages before the circuit, in the contract's order; without a rate limit
    (`rate_limit` None) that stage is left out."""
    stages: list[ClaimStage] = [
        PreferencesStage(router=router, end=end, fail=fail, worker_id=worker_id),
        SuppressionStage(
            repository=suppressions, router=router, end=end, fail=fail, worker_id=worker_id
        ),
        ExpiryStage(end=end, worker_id=worker_id),
        QuietHoursStage(repository=repository, fail=fail, held=quiet_held),
    ]
    if rate_limit is not None and pruner is not None:
        stages.append(
            RateLimitStage(
                rate_limit=rate_limit,
                repository=rate_limits,
                pruner=pruner,
                fail=fail,
                deferred=deferred,
                worker_id=worker_id,
            )
        )
    return SendChecks(stages)
