"""Single creates that arrive together share one statement
(docs/decisions/0002-gathered-creates.md).

A create costs PostgreSQL mostly per statement (its round trip, its function call, its commit
and the wake-ups on both sides), not per row: two creates in one statement cost about what one
does alone. `CreateCombiner` gathers the checked creates of a process's threads: the statements
themselves are the repository's (notifications/repositories.py gives the combiner its two
senders), the waiting and handing on are here.

Invariants protected here:
- a thread that finds no statement running sends its own create at once: a process that is
  not busy waits for nothing;
- each create stays its own: no two creates with the same client and key share a statement
  (the later one is answered "nothing inserted"), and if a gathered statement fails, each of
  its creates is sent again alone by its own thread, so one create's error is never another's;
- every waiting thread is handed an outcome, whatever the statement did.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any

# A create's parameters (with its `client_id` and `idempotency_key`), and its statement's
# answer: the new row's values, or None when nothing was inserted.
Params = dict[str, Any]
Outcome = Sequence[Any] | None


class _Waiting:
    """A create in `CreateCombiner`: its parameters, then its outcome. A thread that waits for
    its outcome holds `ready`, a lock taken when the create arrived, and blocks taking it
    again; the thread that sets the outcome releases it (a plain lock: a `threading.Event` a
    create cost about 6 % of the API's Python under load)."""

    __slots__ = ("outcome", "params", "ready")

    def __init__(self, params: Params, *, waits: bool) -> None:
        self.params = params
        self.outcome: Any = None
        self.ready = threading.Lock() if waits else None
        if self.ready is not None:
            self.ready.acquire()

    def wait(self) -> Any:
        self.ready.acquire()
        return self.outcome

    def give(self, outcome: Any) -> None:
        self.outcome = outcome
        self.ready.release()


# Outcomes of a `_Waiting` other than a row or None.
_LEAD = object()  # this thread sends the next statement, for every create then waiting
_ALONE = object()  # the gathered statement failed: this thread sends its own create


class CreateCombiner:
    """Sends the creates of a process's threads, gathering those that arrive while one of its
    statements runs into the next statement.

    A thread that finds no statement running sends its own create at once with `send_one`. A
    thread that finds one running waits for it to end; then one waiting thread (the first)
    sends every create waiting at that moment, at most `max_items`, as one statement
    (`send_many`, on its own connection), and hands each thread its outcome. Creates with the
    same client and key never share a statement: the later one is answered None, "nothing
    inserted". If the gathered statement fails, each of its creates is sent again alone by its
    own thread.

    One per process (the repository's); a process forked while one of its threads sent a
    statement calls `reset` in the child, which has no such thread.
    """

    def __init__(
        self,
        *,
        send_one: Callable[[Params], Outcome],
        send_many: Callable[[list[Params]], list[Outcome]],
        max_items: int = 64,
    ) -> None:
        self.send_one = send_one
        self.send_many = send_many
        self.max_items = max_items
        self._lock = threading.Lock()
        self._waiting: list[_Waiting] = []
        self._sending = False

    def send(self, params: Params) -> Outcome:
        """The outcome of the create `params`: its statement's answer for it."""
        with self._lock:
            lead = not self._sending
            self._sending = True
            waiting = _Waiting(params, waits=not lead)
            self._waiting.append(waiting)
        if not lead:
            outcome = waiting.wait()
            if outcome is _ALONE:
                return self.send_one(params)
            if outcome is not _LEAD:
                return outcome
        with self._lock:
            gathered = self._waiting[: self.max_items]
            del self._waiting[: self.max_items]
        others = [each for each in gathered if each is not waiting]
        try:
            outcomes = self._send(gathered)
        except BaseException as exc:
            self._hand_on()
            for other in others:
                other.give(_ALONE)
            if not others or not isinstance(exc, Exception):
                raise
            return self.send_one(params)
        self._hand_on()
        for each, outcome in zip(gathered, outcomes, strict=True):
            if each is waiting:
                mine = outcome
            else:
                each.give(outcome)
        return mine

    def waiting(self) -> int:
        """How many creates wait for the statement running now to end."""
        with self._lock:
            return len(self._waiting)

    def reset(self) -> None:
        """Nobody sending, nobody waiting: for a forked child."""
        self._lock = threading.Lock()
        self._waiting = []
        self._sending = False

    def _hand_on(self) -> None:
        """The first create waiting now sends the next statement; none: the next to come."""
        with self._lock:
            if self._waiting:
                self._waiting[0].give(_LEAD)
            else:
                self._sending = False

    def _send(self, gathered: list[_Waiting]) -> list[Outcome]:
        if len(gathered) == 1:
            return [self.send_one(gathered[0].params)]
        # A later create with the same client and key is left out: "nothing inserted".
        keys: set[tuple[uuid.UUID, str]] = set()
        positions: list[int | None] = []
        items: list[Params] = []
        for each in gathered:
            key = (each.params["client_id"], each.params["idempotency_key"])
            if key in keys:
                positions.append(None)
            else:
                keys.add(key)
                positions.append(len(items))
                items.append(each.params)
        rows = self.send_many(items)
        return [None if position is None else rows[position] for position in positions]
