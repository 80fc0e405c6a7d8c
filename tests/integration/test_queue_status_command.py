"""`manage.py queue_status`: the queue as /status sees it, per status and priority, for a
terminal; exit status 1 when /status would be degraded."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from delivery.models import WorkerHeartbeat
from notifications.models import Notification, Priority, Status
from tests.support.factories import ClientFactory, NotificationFactory
from tests.support.operator_helpers import notifications_insert_bulk

pytestmark = pytest.mark.django_db


def queue_status() -> str:
    out = io.StringIO()
    call_command("queue_status", stdout=out)
    return out.getvalue()


def row(output: str, status: str) -> list[str]:
    return next(line.split() for line in output.splitlines() if line.startswith(status + " "))


def test_prints_depth_per_status_and_priority_dead_letters_and_workers():
    client = ClientFactory()
    NotificationFactory.create_batch(2, client=client, priority=Priority.HIGH)
    NotificationFactory(client=client, priority=Priority.LOW)
    notifications_insert_bulk(client_id=client.id, count=4)
    NotificationFactory(client=client, status=Status.SENT)
    WorkerHeartbeat.objects.create(
        worker_id="host:1:abc",
        hostname="host",
        pid=1,
        started_at=timezone.now(),
        last_seen_at=timezone.now(),
    )

    output = queue_status()

    assert output.splitlines()[0].endswith(": ok")
    assert output.splitlines()[2].split() == [
        "status",
        "CRITICAL",
        "HIGH",
        "NORMAL",
        "LOW",
        "total",
    ]
    assert row(output, "PENDING") == ["PENDING", "0", "2", "0", "1", "3"]
    assert row(output, "DEAD_LETTERED")[-1] == "4"
    assert "dead letters:        4" in output
    assert "workers live:        1" in output


def test_a_late_queue_with_no_worker_exits_1_with_the_reason():
    NotificationFactory(client=ClientFactory())
    Notification.objects.update(due_at=timezone.now() - timedelta(minutes=5))

    with pytest.raises(CommandError, match="degraded: no live worker") as raised:
        queue_status()
    assert raised.value.returncode == 1


@pytest.mark.django_db(transaction=True)
def test_a_reader_that_closes_the_pipe_early_gets_no_traceback(database_url):
    """`notifyqueue queue_status | head -1`: the reader has gone before the output is written."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [str(Path(sys.executable).parent / "notifyqueue"), "queue_status"],
            env={**os.environ, "DATABASE_URL": database_url},
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write_end)

    assert done.returncode == 128 + signal.SIGPIPE
    assert done.stderr == ""
