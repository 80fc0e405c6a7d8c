"""A loop's database outage is logged once with its traceback, reminded of at most every
REMINDER_S, and ended with one line saying how long it lasted."""

from __future__ import annotations

import logging

from django.db import OperationalError

from notifyqueue.outage import REMINDER_S, OutageLog

log = logging.getLogger("tests.outage")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def fail(outage: OutageLog) -> None:
    try:
        raise OperationalError("the server closed the connection")
    except OperationalError:
        outage.failed(0.5)


def traceback_of(record: logging.LogRecord) -> bool:
    """Whether the record carries a traceback (a database error's is kept as text without the
    error's own words: notifyqueue/logformat.py)."""
    return record.exc_info is not None or "Traceback" in (record.exc_text or "")


def test_an_outage_of_many_failed_steps_is_three_lines_with_one_traceback(caplog):
    clock = Clock()
    outage = OutageLog(log, "delivery loop worker=w1", clock=clock)
    caplog.set_level(logging.DEBUG, logger="tests.outage")

    for _ in range(int(REMINDER_S / 0.5) + 10):  # failures every half second, past a reminder
        fail(outage)
        clock.now += 0.5
    outage.succeeded()
    outage.succeeded()  # nothing more to end

    records = [(r.levelname, r.getMessage(), traceback_of(r)) for r in caplog.records]
    assert records == [
        (
            "ERROR",
            "delivery loop worker=w1: database error; retrying every 0.5s until it answers",
            True,
        ),
        (
            "ERROR",
            "delivery loop worker=w1: database still failing after 30s "
            "(61 steps failed; the last: OperationalError)",
            False,
        ),
        (
            "WARNING",
            "delivery loop worker=w1: database answers again after 35.0s (70 steps failed)",
            False,
        ),
    ]


def test_a_new_outage_after_a_success_is_logged_with_its_traceback_again(caplog):
    clock = Clock()
    outage = OutageLog(log, "webhook sender", clock=clock)
    caplog.set_level(logging.DEBUG, logger="tests.outage")

    fail(outage)
    outage.succeeded()
    clock.now += 60
    fail(outage)
    fail(outage)

    tracebacks = [r.getMessage() for r in caplog.records if traceback_of(r)]
    assert (
        tracebacks
        == [
            "webhook sender: database error; retrying every 0.5s until it answers",
        ]
        * 2
    )
    assert len(caplog.records) == 3
