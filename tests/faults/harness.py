"""The fault suite's parts: real `run_worker` processes and the universal check.

Everything here is real: the provider (`ScriptedProvider`, tests/support/http_servers.py) is an
HTTP server on 127.0.0.1 that keeps an idempotency store like a real one, workers are
`manage.py run_worker` subprocesses (stoppable, killable, startable under `faketime`), and the
check reads PostgreSQL and what the provider and the webhook receiver saw.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path

from django.db import connection

from notifications.models import Notification, Status
from tests.support.http_servers import ScriptedProvider
from tests.support.queue_table import queue_differences, webhook_queue_differences

ROOT = Path(__file__).resolve().parents[2]
FINAL = {
    Status.SENT,
    Status.FAILED,
    Status.DEAD_LETTERED,
    Status.SUPPRESSED,
    Status.EXPIRED,
    Status.CANCELLED,
    Status.DIGESTED,
}
# Final, and never sent: no provider may have accepted them (a DIGESTED one went in its
# digest, under the digest's own key).
UNSENT = {Status.EXPIRED, Status.CANCELLED, Status.DIGESTED}
# The final statuses a webhook event reports (a cancel is the client's own doing: none).
REPORTED = FINAL - {Status.CANCELLED}
# Backoff, claim and provider timeouts short enough for a suite of minutes, with the claim
# timeout at twice the provider timeout as run_worker requires.
WORKER_ENV = {
    "NOTIFYQUEUE_EMAIL_PROVIDER": "http",
    "NOTIFYQUEUE_SMS_PROVIDER": "http",
    "NOTIFYQUEUE_PUSH_PROVIDER": "http",
    "NOTIFYQUEUE_WEBHOOK_ALLOW_PRIVATE": "true",
    "NOTIFYQUEUE_PROVIDER_TIMEOUT_SECONDS": "1",
    "NOTIFYQUEUE_CLAIM_TIMEOUT_SECONDS": "2",
    "NOTIFYQUEUE_BACKOFF_BASE_SECONDS": "0.05",
    "NOTIFYQUEUE_BACKOFF_MAX_SECONDS": "0.2",
    "NOTIFYQUEUE_POLL_INTERVAL_SECONDS": "0.1",
    "NOTIFYQUEUE_HEARTBEAT_SECONDS": "0.2",
    "NOTIFYQUEUE_CIRCUIT_FAILURE_THRESHOLD": "1000",
    # A webhook whose result was lost with a terminated connection is sent again (same
    # eventId) once its claim expires: seconds here, not the default minute.
    "NOTIFYQUEUE_WEBHOOK_TIMEOUT_SECONDS": "1",
    "NOTIFYQUEUE_WEBHOOK_CLAIM_TIMEOUT_SECONDS": "3",
    # The retry schedule in seconds, not the default's minutes and hours: a POST that fails
    # once after a takeover (whose abandoned claim counted an attempt) would otherwise wait
    # the default's third step, 5 minutes, past any wait of the check below.
    "NOTIFYQUEUE_WEBHOOK_RETRY_SCHEDULE": "0,0.2,0.5,1",
}


class Workers:
    """`manage.py run_worker` subprocesses; every one still running is killed at exit."""

    def __init__(self, database_url: str, provider_url: str, **env: str) -> None:
        self.env = {
            **os.environ,
            **WORKER_ENV,
            "DATABASE_URL": database_url,
            "NOTIFYQUEUE_EMAIL_PROVIDER_URL": provider_url,
            "NOTIFYQUEUE_SMS_PROVIDER_URL": provider_url,
            "NOTIFYQUEUE_PUSH_PROVIDER_URL": provider_url,
            **env,
        }
        self.processes: list[subprocess.Popen] = []

    def start(self, *args: str, faketime: str | None = None, **env: str) -> subprocess.Popen:
        command = [sys.executable, "manage.py", "run_worker", "--concurrency", "4", *args]
        if faketime is not None:
            # libfaketime preloaded into the worker itself (the `faketime` command would run
            # it as a child that our signals never reach). Only the wall clock is skewed, as
            # on a host whose clock is set wrong; its monotonic clock still runs true.
            env = {
                "LD_PRELOAD": faketime_library(),
                "FAKETIME": faketime,
                "FAKETIME_DONT_FAKE_MONOTONIC": "1",
                **env,
            }
        # The log goes to a file: a pipe nobody reads fills up and blocks the worker.
        log = tempfile.NamedTemporaryFile(  # noqa: SIM115 (closed with the process)
            mode="w+", prefix="run_worker-", suffix=".log"
        )
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env={**self.env, **env},
            stdout=subprocess.DEVNULL,
            stderr=log,
            text=True,
        )
        process.log = log
        self.processes.append(process)
        return process

    @staticmethod
    def _started(process: subprocess.Popen) -> bool:
        with open(process.log.name) as log:
            return " started: " in log.read()

    def logs(self) -> str:
        """The end of each worker's log, for a failing test's report."""
        tails = []
        for process in self.processes:
            process.log.seek(0)
            tails.append(f"--- pid {process.pid} ---\n{process.log.read()[-3000:]}")
        return "\n".join(tails)

    def stop_all(self, timeout_s: float = 30) -> None:
        """SIGTERM to every live worker, once it has started (its handlers are installed
        before it says so): a worker stopped while still importing Django is not the point."""
        for process in self.processes:
            wait_until(
                lambda process=process: process.poll() is not None or self._started(process),
                timeout_s=timeout_s,
                what=f"worker {process.pid} to start",
            )
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc_info) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait()
            process.log.close()


def faketime_library() -> str:
    """libfaketime from Debian's `faketime` package (python3 dev.py test installs it); the
    tests that need it skip only when it cannot be had."""
    import pytest

    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1"))
    if not found:
        pytest.skip(
            "libfaketime is not installed (python3 dev.py test installs Debian's faketime with "
            "apt-get when run as root, unless NOTIFYQUEUE_DEV_NO_APT=1)"
        )
    return found[0]


def wait_until(predicate, *, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def all_final() -> bool:
    return not Notification.objects.exclude(status__in=FINAL).exists()


def notifications_create(client, recipients: list[str], *, channel: str = "email", **fields):
    """One notification per recipient, created through the service as the API would."""
    from tests.support.factories import NotificationFactory

    return [
        NotificationFactory(client=client, channel=channel, recipient=r, max_attempts=4, **fields)
        for r in recipients
    ]


def universal_check(
    provider: ScriptedProvider,
    workers: Workers,
    *,
    webhooks=None,
    rate_limit: tuple[int, float] | None = None,
) -> dict[str, int]:
    """What must hold after any fault, whatever happened on the way:

    - every notification is in a final state, with exactly one attempt recorded as the one
      that ended it (SENT: exactly one SENT attempt);
    - an EXPIRED or CANCELLED notification was never sent: the provider accepted nothing
      under its key;
    - the provider was only ever called under the key `<notification id>:<channel>`, and each
      SENT notification was really sent by the provider exactly once (under its own key);
    - no recipient got more than `limit` sends in any window (the provider's own timestamps,
      over a window shortened by half a second for the gap between admission and arrival);
    - each final state was reported by exactly one webhook event (one eventId), if a
      receiver is given;
    - the queue table (notification_queue) holds exactly the record's rows that are not SENT,
      with the same queue columns.
    The webhooks are awaited while the workers still run (their senders deliver them); then
    the workers are stopped with SIGTERM, and each must exit 0: none died of what was done to
    it. Returns the count of notifications per final status."""
    if webhooks is not None:
        expected = {
            (str(i), s)
            for i, s in Notification.objects.values_list("id", "status")
            if s in REPORTED
        }
        try:
            wait_until(
                lambda: expected <= webhook_reports(webhooks),
                timeout_s=30,
                what="a webhook for every final state",
            )
        except AssertionError as exc:
            missing = expected - webhook_reports(webhooks)
            raise AssertionError(
                f"{exc}\nmissing: {sorted(missing)[:5]}\n"
                f"their events: {webhook_event_states(missing)}\n{workers.logs()}"
            ) from None
    workers.stop_all()
    codes = [process.returncode for process in workers.processes if process.returncode != -9]
    assert set(codes) <= {0}, f"{codes}\n{workers.logs()}"
    rows = list(Notification.objects.values_list("id", "status", "channel", "recipient"))
    not_final = [(str(i), s) for i, s, _, _ in rows if s not in FINAL]
    assert not not_final, f"not final: {not_final[:5]}"
    keys = {f"{i}:{c}" for i, _, c, _ in rows}
    strange = {c.key for c in provider.calls} - keys
    assert not strange, f"provider called under unknown keys: {sorted(strange)[:3]}"
    for notification_id, status, channel, _ in rows:
        if status == Status.SENT:
            assert f"{notification_id}:{channel}" in provider.sends, notification_id
        if status in UNSENT:
            assert f"{notification_id}:{channel}" not in provider.sends, (notification_id, status)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT notification_id, count(*) FROM delivery_attempt WHERE outcome = 'SENT' "
            "GROUP BY notification_id HAVING count(*) > 1"
        )
        twice = cursor.fetchall()
    assert not twice, f"recorded as sent more than once: {twice[:3]}"
    # The queue table equals the record: whatever was killed or cut off, its triggers ran in
    # the statement that changed the record, or neither happened.
    astray = queue_differences()
    assert not astray, f"the queue table differs from the record: {astray[:3]}"
    astray = webhook_queue_differences()
    assert not astray, f"the webhook queue differs from the events: {astray[:3]}"
    if rate_limit is not None:
        limit, window_s = rate_limit
        by_recipient: dict[str, list[float]] = defaultdict(list)
        for call in provider.sends.values():
            by_recipient[call.recipient].append(call.at)
        for recipient, times in by_recipient.items():
            times.sort()
            for i in range(len(times) - limit):
                span = times[i + limit] - times[i]
                assert span >= window_s - 0.5, (recipient[:40], limit, span)
    if webhooks is not None:
        expected = {(str(i), s) for i, s, _, _ in rows if s in REPORTED}
        per_state: dict[tuple[str, str], set[str]] = defaultdict(set)
        for request in webhooks.requests:
            event = json.loads(request.body)
            if event.get("type", "status") == "status":
                per_state[(event["jobId"], event["status"])].add(event["eventId"])
        assert set(per_state) == expected, set(per_state) ^ expected
        assert all(len(ids) == 1 for ids in per_state.values())
    counts: dict[str, int] = defaultdict(int)
    for _, status, _, _ in rows:
        counts[status] += 1
    return dict(counts)


def webhook_reports(webhooks) -> set[tuple[str, str]]:
    reports = set()
    for request in list(webhooks.requests):
        event = json.loads(request.body)
        reports.add((event["jobId"], event["status"]))
    return reports


def webhook_event_states(reports: set[tuple[str, str]]) -> list[tuple]:
    """What PostgreSQL holds for the status events of `reports` (notification id, status): why
    one never reached the receiver."""
    ids = sorted({notification_id for notification_id, _ in reports})[:5]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT notification_id, status, state, delivery_attempts, next_attempt_at, "
            "claimed_by, last_error FROM webhook_event "
            "WHERE notification_id = ANY(%s::uuid[]) AND type = 'status' ORDER BY notification_id",
            [ids],
        )
        return cursor.fetchall()


def new_key() -> str:
    return uuid.uuid4().hex
