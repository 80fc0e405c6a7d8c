"""The worker's pure decisions about preferences, fallback and the circuit: no database."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime

from delivery.models import Outcome
from delivery.providers.base import Accepted, PermanentFailure, TemporaryFailure
from delivery.repositories import Claim, Finish
from delivery.services import RetryPolicy, Route, SendRoutes, attempt_finish, claim_recheck
from notifications.models import Status

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
POLICY = RetryPolicy(base_s=0.5, max_s=60)
EMAIL = Route("email", "ada@example.com", "Shipped", "Order A-17 shipped", ("sms",))


def claim(**overrides) -> Claim:
    fields = {
        "id": uuid.uuid4(),
        "claim_token": uuid.uuid4(),
        "client_id": uuid.uuid4(),
        "channel": "push",
        "recipient": "device-token-1",
        "subject": "",
        "body": "A-17 shipped",
        "metadata": {},
        "priority": 2,
        "attempt_count": 1,
        "max_attempts": 3,
        "user_id": "u-1",
        "template": "order_shipped",
        "payload": {"order": "A-17"},
        "fallback_channels": ("email", "sms"),
    }
    return Claim(**{**fields, **overrides})


class FakeRouter:
    def __init__(self, next_: Route | None = None) -> None:
        self.next_ = next_
        self.asked: list[str] = []

    def route_next(self, claim):
        self.asked.append("next")
        return self.next_


def finish(c: Claim, result, router=None) -> Finish:
    return attempt_finish(c, result, policy=POLICY, rng=random.Random(1), router=router)


def test_temporary_failure_with_attempts_left_retries_the_same_channel_without_asking():
    router = FakeRouter(next_=EMAIL)
    result = finish(claim(attempt_count=2), TemporaryFailure("503"), router)
    assert (result.status, result.channel, result.attempt_reset) == (Status.PENDING, None, False)
    assert result.delay_s > 0
    assert router.asked == []


def test_last_temporary_failure_switches_to_the_next_fallback_with_attempts_reset():
    result = finish(claim(attempt_count=3), TemporaryFailure("503"), FakeRouter(next_=EMAIL))
    assert result.status == Status.PENDING
    assert result.outcome == Outcome.TEMPORARY_FAILURE and result.error == "503"
    assert (result.channel, result.recipient, result.subject, result.body) == (
        "email",
        "ada@example.com",
        "Shipped",
        "Order A-17 shipped",
    )
    assert result.fallback_channels == ("sms",)
    assert result.attempt_reset is True and result.delay_s == 0


def test_last_temporary_failure_without_a_usable_fallback_is_dead_lettered():
    assert finish(claim(attempt_count=3), TemporaryFailure("x"), FakeRouter()).status == (
        Status.DEAD_LETTERED
    )
    router = FakeRouter(next_=EMAIL)
    no_fallbacks = claim(attempt_count=3, fallback_channels=())
    assert finish(no_fallbacks, TemporaryFailure("x"), router).status == Status.DEAD_LETTERED
    assert router.asked == []  # nothing left to ask about


def test_permanent_rejection_moves_to_a_fallback_or_fails():
    switched = finish(claim(), PermanentFailure("bad token"), FakeRouter(next_=EMAIL))
    assert (switched.status, switched.channel, switched.outcome) == (
        Status.PENDING,
        "email",
        Outcome.PERMANENT_FAILURE,
    )
    assert finish(claim(), PermanentFailure("bad token"), FakeRouter()).status == Status.FAILED


def test_a_direct_notification_never_asks_for_routes():
    direct = claim(user_id=None, template=None, payload=None, fallback_channels=())
    sent = finish(direct, Accepted("m-1"), FakeRouter())
    assert (sent.status, sent.recipient) == (Status.SENT, None)  # the stored recipient stays


def test_recheck_sends_on_the_same_channel_at_the_users_current_address():
    routes = SendRoutes(current=Route("push", "new-device-token", "", "x", ("email",)))
    rechecked = claim_recheck(claim(), routes)
    assert isinstance(rechecked, Claim)
    assert (rechecked.channel, rechecked.recipient) == ("push", "new-device-token")
    sent = finish(rechecked, Accepted("m-1"))
    assert sent.recipient == "new-device-token"  # and the row records it


def test_recheck_switches_to_the_next_allowed_fallback_without_using_an_attempt():
    rechecked = claim_recheck(claim(), SendRoutes(current=None, fallback=EMAIL))
    assert isinstance(rechecked, Finish)
    assert (rechecked.status, rechecked.channel, rechecked.outcome) == (
        Status.PENDING,
        "email",
        Outcome.REROUTED,
    )
    assert rechecked.attempt_reset is True and rechecked.delay_s == 0
    assert "no longer allowed" in rechecked.error


def test_recheck_with_nothing_allowed_suppresses_and_gives_the_attempt_back():
    rechecked = claim_recheck(claim(), SendRoutes(current=None))
    assert isinstance(rechecked, Finish)
    assert (rechecked.status, rechecked.attempt_delta) == (Status.SUPPRESSED, -1)
    assert rechecked.error.startswith("suppressed:")
