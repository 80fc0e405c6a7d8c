"""One helper for races decided by PostgreSQL: threads with their own connections, released
together at one barrier."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import connections


def run_in_threads(
    count: int, target: Callable[[int, threading.Barrier], Any], *, timeout_s: float = 120
) -> list:
    """Runs target(i, barrier) on `count` threads, each with its own database connection (closed
    when its thread ends); returns the results in thread order. The first error is re-raised, and
    aborts the barrier so the other threads do not wait for a thread that will never come. A
    thread still running after `timeout_s` fails the race instead of hanging the suite."""
    barrier = threading.Barrier(count)
    results: list = [None] * count
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            results[i] = target(i, barrier)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()
        finally:
            connections.close_all()

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s)
    if errors:
        raise errors[0]
    stuck = sum(thread.is_alive() for thread in threads)
    assert stuck == 0, f"{stuck} of {count} threads still running after {timeout_s}s"
    return results
