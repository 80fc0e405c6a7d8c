"""The send threads and the claims waiting for them (delivery/sending.py), with a provider
that answers only when the test lets it: which call starts when a slot frees, and which
waiting claims are given back instead."""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid

from delivery.providers.base import Accepted, Message
from delivery.repositories import Claim
from delivery.sending import Sends

CLIENT_A = uuid.uuid4()


class GatedProvider:
    """Records each call's notification id, then waits for the gate."""

    name = "gated"

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.calls: list[uuid.UUID] = []
        self._lock = threading.Lock()

    def send(self, message: Message) -> Accepted:
        with self._lock:
            self.calls.append(message.notification_id)
        assert self.gate.wait(10)
        return Accepted(message_id=None)


def claim(priority: int = 2) -> Claim:
    return Claim(
        id=uuid.uuid4(),
        claim_token=uuid.uuid4(),
        client_id=uuid.uuid4(),
        channel="email",
        recipient="a@example.com",
        subject="",
        body="b",
        metadata={},
        priority=priority,
        attempt_count=1,
        max_attempts=6,
    )


class KeyedProvider:
    """Records each call's notification id, then waits until the test releases that id."""

    name = "keyed"

    def __init__(self) -> None:
        self.calls: list[uuid.UUID] = []
        self.released: dict[uuid.UUID, threading.Event] = {}
        self._lock = threading.Lock()

    def gate(self, notification_id: uuid.UUID) -> threading.Event:
        with self._lock:
            return self.released.setdefault(notification_id, threading.Event())

    def send(self, message: Message) -> Accepted:
        with self._lock:
            self.calls.append(message.notification_id)
        assert self.gate(message.notification_id).wait(10)
        return Accepted(message_id=None)


def answers(sends: Sends, count: int) -> list:
    collected: list = []
    deadline = time.monotonic() + 10
    while len(collected) < count:
        assert time.monotonic() < deadline, collected
        collected += sends.collect(wait_s=0.1)
    return collected


def test_a_freed_slot_starts_a_waiting_critical_first_then_the_others_in_claim_order():
    """The claim already put each client's rows in priority order and the clients in turn; the
    waiting claims keep that order, and only a CRITICAL passes them."""
    provider = GatedProvider()
    sends = Sends(1, threading.Event(), waiting=3)
    first, normal, critical, low = claim(2), claim(2), claim(0), claim(3)
    for c in (first, low, normal, critical):
        sends.submit(provider, c, None, time.monotonic())
    assert sends.free == 0
    provider.gate.set()

    answered = answers(sends, 4)

    assert provider.calls == [first.id, critical.id, low.id, normal.id]
    assert {a.claim.id for a in answered} == {first.id, critical.id, normal.id, low.id}
    assert sends.free == 4
    sends.close()


def test_a_freed_slot_goes_to_the_waiting_claim_of_a_client_with_no_call_running():
    """Client a's calls fill both slots and two more of a's wait; b's claim, claimed after
    them, starts in the first slot that frees, then a's in their order."""
    provider = KeyedProvider()
    sends = Sends(2, threading.Event(), waiting=3)
    a = [dataclasses.replace(claim(), client_id=CLIENT_A) for _ in range(4)]
    b = claim()
    for c in (*a, b):
        sends.submit(provider, c, None, time.monotonic())
    deadline = time.monotonic() + 10
    while len(provider.calls) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    provider.gate(a[0].id).set()  # a[1] still runs
    while len(provider.calls) < 3:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert provider.calls[2] == b.id
    provider.gate(a[1].id).set()
    while len(provider.calls) < 4:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert provider.calls[3] == a[2].id
    for c in (*a, b):
        provider.gate(c.id).set()
    answers(sends, 5)
    assert provider.calls[4] == a[3].id
    sends.close()


def test_a_waiting_claim_past_its_start_time_is_withdrawn_not_sent():
    provider = GatedProvider()
    sends = Sends(1, threading.Event(), waiting=1)
    running, late = claim(), claim()
    sends.submit(provider, running, None, time.monotonic())
    sends.submit(provider, late, None, time.monotonic(), start_by=time.monotonic() + 0.05)
    time.sleep(0.1)
    provider.gate.set()

    answered = answers(sends, 1)

    assert [a.claim.id for a in answered] == [running.id]
    assert sends.withdrawn() == [late]
    assert provider.calls == [running.id]
    assert sends.outstanding == 0
    sends.close()


def test_once_stopping_no_waiting_claim_starts_and_all_are_withdrawn():
    provider = GatedProvider()
    stopping = threading.Event()
    sends = Sends(1, threading.Event(), waiting=2, stopping=stopping)
    running, waiting = claim(), [claim(), claim()]
    for c in (running, *waiting):
        sends.submit(provider, c, None, time.monotonic())
    stopping.set()
    provider.gate.set()

    answered = answers(sends, 1)
    time.sleep(0.05)

    assert [a.claim.id for a in answered] == [running.id]
    assert provider.calls == [running.id]
    assert sorted(c.id for c in sends.withdrawn(everything=True)) == sorted(c.id for c in waiting)
    assert sends.outstanding == 0
    sends.close()


class TimedProvider:
    """Answers after `delay_s`."""

    name = "timed"

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def send(self, message: Message) -> Accepted:
        time.sleep(self.delay_s)
        return Accepted(message_id=None)


def test_the_claims_held_ready_are_sized_to_the_slots_that_free_during_one_turn_of_the_loop():
    """Until a call has been timed, all `waiting` are held ready. Then as many as slots free
    while the loop turns once: with calls of 0.2 s on 8 slots, a loop turning in 10 ms needs
    one (8 x 0.01 / 0.2 = 0.4), one turning in 60 ms three (2.4), and never more than
    `waiting`; `free` counts only those."""
    sends = Sends(8, threading.Event(), waiting=4)
    assert sends.ready_size(0.01) == 4
    assert sends.free == 12
    provider = TimedProvider(0.2)
    for _ in range(8):
        sends.submit(provider, claim(), None, time.monotonic())
    answers(sends, 8)
    assert sends.call_s is not None and 0.2 <= sends.call_s < 0.4

    assert sends.ready_size(0.01) == 1
    assert sends.free == 9
    assert sends.ready_size(0.06) == 3
    assert sends.ready_size(1.0) == 4
    assert sends.ready_size(None) == 4
    sends.close()


def test_one_slot_holds_no_claim_ready_whatever_the_provider():
    sends = Sends(1, threading.Event(), waiting=0)
    sends.submit(TimedProvider(0.05), claim(), None, time.monotonic())
    answers(sends, 1)
    assert sends.ready_size(10.0) == 0
    assert sends.free == 1
    sends.close()
