"""How a process's loop reports a database it cannot reach: once an outage, not once a retry.

A worker's loop and its webhook sender retry a failed step every poll interval for as long as
PostgreSQL is away (a restart, a failover to the standby: tests/faults/test_failover.py).
Logging every retry's traceback writes the same traceback several times a second from each
process for the whole outage. `OutageLog` logs the first failure with its traceback, a line at
most every REMINDER_S while the failures go on, and one line when a step succeeds again,
saying how long the outage lasted and how many steps failed.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable

# While a step keeps failing, the most often a line says so.
REMINDER_S = 30.0


class OutageLog:
    def __init__(
        self, log: logging.Logger, what: str, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._log = log
        self._what = what
        self._clock = clock
        self._since: float | None = None
        self._failures = 0
        self._reminded_at = 0.0

    def failed(self, retry_s: float) -> None:
        """A step failed; called in its `except` block. The first failure of a run is logged
        with its traceback."""
        now = self._clock()
        if self._since is None:
            self._since, self._failures, self._reminded_at = now, 1, now
            self._log.exception(
                "%s: database error; retrying every %.1fs until it answers", self._what, retry_s
            )
            return
        self._failures += 1
        if now - self._reminded_at >= REMINDER_S:
            self._reminded_at = now
            self._log.error(
                "%s: database still failing after %.0fs (%d steps failed; the last: %s)",
                self._what,
                now - self._since,
                self._failures,
                type(sys.exc_info()[1]).__name__,
            )

    def succeeded(self) -> None:
        """A step succeeded: ends a run of failures, if there was one, with a line."""
        if self._since is None:
            return
        self._log.warning(
            "%s: database answers again after %.1fs (%d steps failed)",
            self._what,
            self._clock() - self._since,
            self._failures,
        )
        self._since = None
