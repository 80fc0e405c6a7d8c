"""One structured line per state change, and the JSON form of it (LOG_FORMAT=json)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.utils import timezone

from notifications import retries, services
from notifications.models import Status
from notifyqueue.logformat import JsonFormatter
from tests.support.factories import NotificationFactory

ROOT = Path(__file__).resolve().parents[2]


def record(message: str, *args) -> logging.LogRecord:
    return logging.LogRecord("notifyqueue.delivery", logging.INFO, __file__, 1, message, args, None)


def test_json_formatter_lifts_every_key_value_pair_into_a_field():
    line = JsonFormatter().format(
        record(
            "attempt finished notification=%s client=%s channel=%s attempt=%d outcome=%s",
            "3f6c2b0e",
            "c1",
            "email",
            2,
            "SENT",
        )
    )
    entry = json.loads(line)
    assert entry["logger"] == "notifyqueue.delivery"
    assert entry["level"] == "INFO"
    assert entry["message"].startswith("attempt finished notification=3f6c2b0e")
    assert {k: entry[k] for k in ("notification", "client", "channel", "attempt", "outcome")} == {
        "notification": "3f6c2b0e",
        "client": "c1",
        "channel": "email",
        "attempt": 2,
        "outcome": "SENT",
    }
    assert entry["ts"].endswith("Z")


def test_json_formatter_never_lets_the_message_overwrite_its_own_fields():
    entry = json.loads(JsonFormatter().format(record("odd level=DEBUG message=x")))
    assert entry["level"] == "INFO"
    assert entry["message"] == "odd level=DEBUG message=x"


def test_json_formatter_keeps_extra_fields_and_the_exception():
    try:
        raise ValueError("boom")
    except ValueError:
        failed = logging.LogRecord(
            "notifyqueue.delivery",
            logging.ERROR,
            __file__,
            1,
            "send failed notification=%s",
            ("n1",),
            sys.exc_info(),
        )
    failed.worker = "host-b:733:04ab9d"
    entry = json.loads(JsonFormatter().format(failed))
    assert (entry["notification"], entry["worker"], entry["level"]) == (
        "n1",
        "host-b:733:04ab9d",
        "ERROR",
    )
    assert entry["exception"].startswith("Traceback") and "ValueError: boom" in entry["exception"]
    assert "\n" not in JsonFormatter().format(failed)  # one line, the traceback escaped


@pytest.mark.django_db
def test_retry_and_cancel_each_log_one_line_naming_the_notification(caplog):
    dead = NotificationFactory(status=Status.DEAD_LETTERED, attempt_count=6)
    pending = NotificationFactory()
    caplog.set_level(logging.INFO, logger="notifyqueue.notifications")

    retries.notification_retry(notification_id=dead.id, operator="admin:ops", now=timezone.now())
    services.notification_cancel(
        notification_id=pending.id, client_id=pending.client_id, now=timezone.now()
    )

    lines = [r.getMessage() for r in caplog.records if r.name == "notifyqueue.notifications"]
    assert lines == [
        f"notification retried notification={dead.id} client={dead.client_id} channel=email "
        "attempt=0 outcome=RETRIED status=PENDING operator_retries=1 operator=admin:ops",
        f"notification cancelled notification={pending.id} client={pending.client_id} "
        "channel=email attempt=0 outcome=CANCELLED status=CANCELLED",
    ]


def test_log_format_json_setting_switches_the_console_handler():
    script = (
        "import django, logging; django.setup(); "
        "logging.getLogger('notifyqueue.delivery').info('x notification=n1 attempt=3')"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "notifyqueue.settings", "LOG_FORMAT": "json"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    entry = json.loads(done.stderr.strip().splitlines()[-1])
    assert (entry["notification"], entry["attempt"]) == ("n1", 3)


@pytest.mark.django_db(transaction=True)
def test_a_busy_worker_logs_a_summary_a_second_and_each_attempt_only_at_debug(caplog):
    """300 deliveries: at INFO, summary lines (at most one a second, plus the last) whose
    counts add up to every claim and send; at DEBUG, one line per attempt naming it."""
    import re
    import time

    from tests.support.delivery_helpers import worker_build
    from tests.support.factories import ClientFactory

    NotificationFactory.create_batch(300, client=ClientFactory())
    worker = worker_build(concurrency=4, batch_size=50)
    caplog.set_level(logging.DEBUG, logger="notifyqueue.delivery")
    started = time.monotonic()
    worker.run(until_empty=True)
    elapsed = time.monotonic() - started

    records = [r for r in caplog.records if r.name == "notifyqueue.delivery"]
    info = [r.getMessage() for r in records if r.levelno == logging.INFO]
    summaries = [line for line in info if line.startswith("delivery claimed=")]
    # Besides the summaries, only maintenance: the 300 new rows get their statistics refreshed.
    assert all(line.startswith("statistics refreshed ") for line in info if line not in summaries)
    assert summaries and len(summaries) <= elapsed + 2

    def total(key: str) -> int:
        return sum(int(m.group(1)) for s in summaries if (m := re.search(rf"{key}=(\d+)", s)))

    assert (total("claimed"), total("sent")) == (300, 300)
    attempts = [r.getMessage() for r in records if r.levelno == logging.DEBUG]
    assert sum(line.startswith("attempt finished notification=") for line in attempts) == 300


@pytest.mark.django_db(transaction=True)
def test_an_idle_worker_logs_nothing(caplog, monkeypatch):
    """Steps over an empty queue for longer than the summary interval: not one INFO line
    (a worker idle for a day used to log 86,400)."""
    import time

    from delivery import worker as worker_module
    from tests.support.delivery_helpers import worker_build

    monkeypatch.setattr(worker_module, "LOG_SUMMARY_S", 0.05)
    worker = worker_build()
    try:
        worker.run_once()  # registers the circuits and does its first maintenance
        caplog.set_level(logging.INFO)
        ends = time.monotonic() + 0.5
        steps = 0
        while time.monotonic() < ends:
            step = worker.run_once(wait_s=0.02)
            assert (step.claimed, step.finished) == (0, 0)
            steps += 1
    finally:
        worker.stop()
        worker._shutdown()
    assert steps >= 5
    logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert logged == [], logged[:3]
