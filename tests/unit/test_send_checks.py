"""The send-time stages (delivery/send_checks.py) over in-memory stand-ins: their order, what
each lets through, and where a claim that ends in one goes. No database."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from django.db import OperationalError

from delivery.repositories import Claim, Finish, QuietHeld
from delivery.send_checks import (
    CircuitStage,
    ExpiryStage,
    PreferencesStage,
    QuietHoursStage,
    RateLimitStage,
    SendChecks,
    SuppressionStage,
    send_checks_build,
)
from delivery.services import Route, SendRoutes
from delivery.upkeep import WindowPruner
from notifications.models import Status
from ratelimits.repositories import Deferred
from ratelimits.services import RateLimit

LATER = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def claim(**overrides) -> Claim:
    fields = {
        "id": uuid.uuid4(),
        "claim_token": uuid.uuid4(),
        "client_id": uuid.uuid4(),
        "channel": "email",
        "recipient": "ada@example.com",
        "subject": "Shipped",
        "body": "A-17 shipped",
        "metadata": {},
        "priority": 2,
        "attempt_count": 1,
        "max_attempts": 3,
    }
    return Claim(**{**fields, **overrides})


class Ended:
    """Collects what the stages hand back: claims that ended, and those whose checks failed."""

    def __init__(self) -> None:
        self.finishes: list[Finish] = []
        self.failed: list[tuple[Claim, Exception]] = []
        self.deferred = 0

    def end(self, finish: Finish) -> None:
        self.finishes.append(finish)

    def fail(self, claim: Claim, exc: Exception) -> None:
        self.failed.append((claim, exc))

    def defer(self) -> None:
        self.deferred += 1


class Router:
    """Allows every claim `current`, or fails every read with `error`, or only those that
    include a claim of a `broken` user; records the claims of each read."""

    def __init__(self, current: Route | None = None, error=None, broken=frozenset()) -> None:
        self.current, self.error, self.broken = current, error, broken
        self.calls: list[list[uuid.UUID]] = []

    def routes_at_send(self, claims):
        self.calls.append([c.id for c in claims])
        if self.error or any(c.user_id in self.broken for c in claims):
            raise self.error or OperationalError("server closed the connection")
        return {c.id: SendRoutes(current=self.current) for c in claims}

    def route_next(self, claim):
        return None


class Limits:
    """Admits every claim but those to `full` recipients, which it defers; counts its calls."""

    def __init__(self, full: frozenset[str] = frozenset(), error: Exception | None = None):
        self.full, self.error = full, error
        self.whole_claim_calls: list[int] = []
        self.deferral_calls: list[int] = []

    def recipients_admit(self, *, claims, limit, window_s, ceiling=0):
        self.whole_claim_calls.append(len(claims))
        if self.error:
            raise self.error
        return {c.notification_id for c in claims if c.recipient not in self.full}

    def recipients_defer(self, *, claims, limit, window_s, ceiling=0, ahead):
        if claims:
            self.deferral_calls.append(len(claims))
        return {c.notification_id: Deferred(LATER) for c in claims}


class QuietHours:
    """Holds the claims of `quiet` users until LATER; fails every statement with `error`, or
    only those that include a claim of a `broken` user."""

    def __init__(self, quiet=frozenset(), error=None, broken=frozenset()) -> None:
        self.quiet, self.error, self.broken = quiet, error, broken
        self.calls: list[list[uuid.UUID]] = []

    def notification_quiet_hold(self, claims):
        self.calls.append([c.id for c in claims])
        if self.error or any(c.user_id in self.broken for c in claims):
            raise self.error or OperationalError("time zone not recognized")
        return [QuietHeld(id=c.id, held_until=LATER) for c in claims if c.user_id in self.quiet]


def rate_limit_stage(limits: Limits, ended: Ended) -> tuple[RateLimitStage, WindowPruner]:
    pruner = WindowPruner(repository=limits, window_s=60, batch=3)
    stage = RateLimitStage(
        rate_limit=RateLimit(limit=10, window_s=60),
        repository=limits,
        pruner=pruner,
        fail=ended.fail,
        deferred=ended.defer,
        worker_id="w",
    )
    return stage, pruner


def test_the_stages_run_in_order_each_over_what_the_one_before_let_through():
    seen: list[tuple[str, list[str]]] = []

    class Dropping:
        def __init__(self, name: str, drop: str) -> None:
            self.name, self.drop = name, drop

        def passing(self, claims):
            seen.append((self.name, [c.recipient for c in claims]))
            return [c for c in claims if c.recipient != self.drop]

    claims = [claim(recipient=r) for r in ("a", "b", "c")]
    checks = SendChecks([Dropping("first", "a"), Dropping("second", "b")])
    assert [c.recipient for c in checks.passing(claims)] == ["c"]
    assert seen == [("first", ["a", "b", "c"]), ("second", ["b", "c"])]


class Suppressed:
    """A suppression list of (channel, counting form) -> reason; counts its calls."""

    def __init__(self, entries: dict | None = None, error: Exception | None = None) -> None:
        self.entries, self.error = entries or {}, error
        self.calls: list[int] = []

    def matches(self, checks):
        self.calls.append(len(checks))
        if self.error:
            raise self.error
        found = {c.id: self.entries.get((c.channel, c.address)) for c in checks}
        return {k: v for k, v in found.items() if v}


def test_the_checks_are_in_the_contracts_order_and_without_a_limit_no_rate_limit():
    ended = Ended()
    common = {
        "router": Router(),
        "rate_limits": Limits(),
        "repository": QuietHours(),
        "suppressions": Suppressed(),
        "worker_id": "w",
    }
    callbacks = {
        "end": ended.end,
        "fail": ended.fail,
        "deferred": ended.defer,
        "quiet_held": lambda claim, held: None,
    }
    pruner = WindowPruner(repository=Limits(), window_s=60, batch=3)
    limited = send_checks_build(rate_limit=RateLimit(10, 60), pruner=pruner, **common, **callbacks)
    assert [type(s) for s in limited.stages] == [
        PreferencesStage,
        SuppressionStage,
        ExpiryStage,
        QuietHoursStage,
        RateLimitStage,
    ]
    unlimited = send_checks_build(rate_limit=None, pruner=None, **common, **callbacks)
    assert [type(s) for s in unlimited.stages] == [
        PreferencesStage,
        SuppressionStage,
        ExpiryStage,
        QuietHoursStage,
    ]


def quiet_stage(quiet_hours: QuietHours, ended: Ended):
    held: list[tuple[Claim, QuietHeld]] = []
    stage = QuietHoursStage(
        repository=quiet_hours, fail=ended.fail, held=lambda c, h: held.append((c, h))
    )
    return stage, held


def test_quiet_hours_decide_a_whole_claim_in_one_call_and_hold_only_the_quiet_users_rows():
    quiet_hours, ended = QuietHours(quiet=frozenset({"night-owl"})), Ended()
    stage, held = quiet_stage(quiet_hours, ended)
    claims = [claim(user_id="early-bird"), claim(user_id="night-owl"), claim(user_id="x")]
    assert stage.passing(claims) == [claims[0], claims[2]]
    assert quiet_hours.calls == [[c.id for c in claims]]
    assert held == [(claims[1], QuietHeld(id=claims[1].id, held_until=LATER))]


def test_critical_claims_and_direct_recipients_pass_quiet_hours_without_a_statement():
    quiet_hours, ended = QuietHours(error=AssertionError("asked")), Ended()
    stage, held = quiet_stage(quiet_hours, ended)
    claims = [claim(), claim(user_id="night-owl", priority=0)]
    assert stage.passing(claims) == claims
    assert quiet_hours.calls == [] and held == []


def test_a_failed_quiet_hours_statement_costs_only_the_row_that_fails_alone():
    quiet_hours, ended = QuietHours(quiet=frozenset({"q"}), broken=frozenset({"bad"})), Ended()
    stage, held = quiet_stage(quiet_hours, ended)
    claims = [claim(user_id="ok"), claim(user_id="bad"), claim(user_id="q")]
    assert stage.passing(claims) == [claims[0]]
    assert [c for c, _ in ended.failed] == [claims[1]]
    assert [c for c, _ in held] == [claims[2]]
    assert quiet_hours.calls == [[c.id for c in claims]] + [[c.id] for c in claims]


def test_a_failed_quiet_hours_statement_for_one_claim_is_a_failed_check_for_it():
    error = OperationalError("deadlock detected")
    quiet_hours, ended = QuietHours(error=error), Ended()
    stage, _ = quiet_stage(quiet_hours, ended)
    only = claim(user_id="u")
    assert stage.passing([only]) == []
    assert ended.failed == [(only, error)]


def suppression_stage(entries: dict, ended: Ended, router=None, error=None):
    listed = Suppressed(entries, error)
    stage = SuppressionStage(
        repository=listed, router=router or Router(), end=ended.end, fail=ended.fail, worker_id="w"
    )
    return stage, listed


def test_a_suppressed_address_ends_in_one_look_up_for_the_claim_in_its_counting_form():
    ended = Ended()
    stage, listed = suppression_stage({("email", "ada@example.com"): "hard_bounce"}, ended)
    claims = [claim(recipient="Ada@EXAMPLE.com"), claim(recipient="bob@example.com")]
    assert stage.passing(claims) == [claims[1]]
    assert listed.calls == [2]
    [finish] = ended.finishes
    assert (finish.id, finish.status, finish.error, finish.attempt_delta) == (
        claims[0].id,
        Status.SUPPRESSED,
        "suppressed: hard_bounce",
        -1,
    )


def test_a_suppressed_preference_mode_claim_moves_to_the_users_next_channel():
    class Fallback(Router):
        def route_next(self, claim):
            return Route("sms", "+447700900123", "", "A-17", ())

    ended = Ended()
    stage, _ = suppression_stage(
        {("email", "ada@example.com"): "complaint"}, ended, router=Fallback()
    )
    user_claim = claim(user_id="u-1", template="t", payload={}, fallback_channels=("sms",))
    assert stage.passing([user_claim]) == []
    [finish] = ended.finishes
    assert (finish.status, finish.channel, finish.recipient) == (
        Status.PENDING,
        "sms",
        "+447700900123",
    )
    assert finish.error == "suppressed: complaint; switched to sms"


def test_an_unreadable_suppression_list_fails_the_claims_instead_of_sending():
    ended, error = Ended(), OperationalError("server closed the connection")
    stage, _ = suppression_stage({}, ended, error=error)
    claims = [claim(), claim()]
    assert stage.passing(claims) == []
    assert ended.failed == [(claims[0], error), (claims[1], error)]


def test_the_suppression_stage_asks_nothing_for_an_empty_claim():
    stage, listed = suppression_stage({}, Ended())
    assert stage.passing([]) == []
    assert listed.calls == []


def test_a_claim_past_its_expiry_ends_expired_in_the_expiry_stage_with_its_attempt_returned():
    ended = Ended()
    stage = ExpiryStage(end=ended.end, worker_id="w")
    expired, at_the_second = claim(expires_in_s=-3.0), claim(expires_in_s=0.0)
    later, never = claim(expires_in_s=0.5), claim()
    assert stage.passing([expired, later, at_the_second, never]) == [later, never]
    assert [(f.id, f.status, f.outcome, f.attempt_delta) for f in ended.finishes] == [
        (expired.id, Status.EXPIRED, "EXPIRED", -1),
        (at_the_second.id, Status.EXPIRED, "EXPIRED", -1),
    ]
    # What passes with an expiry (or a cancellation key) is marked started before its send.
    assert later.start_checked and claim(cancellable=True).start_checked
    assert not never.start_checked


def test_a_claim_for_a_direct_recipient_passes_the_preferences_stage_without_a_look_up():
    router, ended = Router(error=AssertionError("looked up")), Ended()
    stage = PreferencesStage(router=router, end=ended.end, fail=ended.fail, worker_id="w")
    direct = claim()
    assert stage.passing([direct]) == [direct]
    assert router.calls == []


def test_a_claim_the_users_preferences_no_longer_allow_ends_in_the_preferences_stage():
    ended = Ended()
    moved = Route("email", "new@example.com", "Shipped", "A-17", ())
    router = Router(current=moved)
    stage = PreferencesStage(router=router, end=ended.end, fail=ended.fail, worker_id="w")
    allowed = claim(user_id="u-1", template="order_shipped", payload={})
    assert [c.recipient for c in stage.passing([allowed])] == ["new@example.com"]

    router.current = None  # opted out, no fallback
    opted_out = claim(user_id="u-2", template="order_shipped", payload={})
    assert stage.passing([opted_out]) == []
    [finish] = ended.finishes
    assert (finish.id, finish.status) == (opted_out.id, Status.SUPPRESSED)


def test_the_preferences_of_a_whole_claim_are_read_at_once_and_the_order_is_kept():
    ended = Ended()
    router = Router(current=Route("email", "new@example.com", "Shipped", "A-17", ()))
    stage = PreferencesStage(router=router, end=ended.end, fail=ended.fail, worker_id="w")
    claims = [claim(user_id="u-1"), claim(), claim(user_id="u-2"), claim(user_id="u-3")]
    passed = stage.passing(claims)
    assert [c.id for c in passed] == [c.id for c in claims]
    assert [c.recipient for c in passed] == [
        "new@example.com",
        "ada@example.com",  # a direct recipient, untouched
        "new@example.com",
        "new@example.com",
    ]
    assert router.calls == [[claims[0].id, claims[2].id, claims[3].id]]


def test_a_failed_read_of_a_claims_preferences_goes_one_by_one_and_fails_only_the_bad_row():
    ended = Ended()
    router = Router(current=Route("email", "ada@example.com", "Shipped", "A-17", ()))
    router.broken = frozenset({"bad"})
    stage = PreferencesStage(router=router, end=ended.end, fail=ended.fail, worker_id="w")
    claims = [claim(user_id="ok"), claim(user_id="bad"), claim(), claim(user_id="fine")]
    assert stage.passing(claims) == [claims[0], claims[2], claims[3]]
    assert [c for c, _ in ended.failed] == [claims[1]]
    assert ended.finishes == []
    concerned = [claims[0].id, claims[1].id, claims[3].id]
    assert router.calls == [concerned] + [[id_] for id_ in concerned]


def test_a_database_error_in_the_preferences_look_up_is_a_failed_check_not_a_pass():
    ended, error = Ended(), OperationalError("server closed the connection")
    stage = PreferencesStage(
        router=Router(error=error), end=ended.end, fail=ended.fail, worker_id="w"
    )
    broken = claim(user_id="u-1", template="order_shipped", payload={})
    assert stage.passing([broken]) == []
    assert ended.failed == [(broken, error)]


def test_the_rate_limit_admits_a_whole_claim_in_one_call_and_counts_it_towards_the_prune():
    limits, ended = Limits(full=frozenset({"busy@example.com"})), Ended()
    stage, pruner = rate_limit_stage(limits, ended)
    claims = [claim(), claim(recipient="busy@example.com"), claim(), claim()]
    admitted = stage.passing(claims)
    assert admitted == [claims[0], claims[2], claims[3]]
    assert limits.whole_claim_calls == [4]
    assert ended.deferred == 1
    assert pruner.admitted == 3 and pruner.due


def test_the_rate_limit_defers_a_claims_over_limit_rows_of_every_key_in_one_call():
    """Ten over-limit rows of one recipient and two of another: one deferral for the twelve,
    never one a row."""
    busy, full = "busy@example.com", "full@example.com"
    limits, ended = Limits(full=frozenset({busy, full})), Ended()
    stage, _ = rate_limit_stage(limits, ended)
    claims = [claim(recipient=r) for r in [busy] * 10 + [full] * 2] + [claim()]
    assert stage.passing(claims) == [claims[-1]]
    assert limits.deferral_calls == [12]
    assert ended.deferred == 12


def test_a_failed_admission_of_one_claim_is_a_failed_check_for_it():
    error = OperationalError("deadlock detected")
    limits, ended = Limits(error=error), Ended()
    stage, pruner = rate_limit_stage(limits, ended)
    only = claim()
    assert stage.passing([only]) == []
    assert ended.failed == [(only, error)]
    assert pruner.admitted == 0


def test_an_unreadable_circuit_lets_the_call_through():
    class Unreadable:
        name = "email:http"

        def admit(self):
            raise OperationalError("circuit row locked")

    stage = CircuitStage({"email": Unreadable()})
    assert stage.admit("email") is None
    assert stage.admit("sms") is None  # no circuit for the channel
