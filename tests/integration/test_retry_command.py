"""`manage.py retry_notifications`: batches until none remain, with progress on stdout."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from notifications import retries
from notifications.models import Notification, Status
from tests.support.factories import ClientFactory
from tests.support.operator_helpers import notifications_insert_bulk

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("retry_notifications", *args, stdout=out)
    return out.getvalue()


def test_command_retries_every_batch_and_prints_progress_and_total():
    client = ClientFactory()
    notifications_insert_bulk(client_id=client.id, count=2500)

    output = run("--status", "DEAD_LETTERED")

    assert output.splitlines() == [
        "batch 1: retried 1000, remaining 1500",
        "batch 2: retried 1000, remaining 500",
        "batch 3: retried 500, remaining 0",
        "done: retried 2500 DEAD_LETTERED notification(s) in 3 batch(es)",
    ]
    pending = Notification.objects.filter(status=Status.PENDING, attempt_count=0)
    assert pending.count() == 2500
    assert pending.first().last_retried_by.startswith("cli:")


def test_command_honours_channel_and_batch_size():
    client = ClientFactory()
    notifications_insert_bulk(client_id=client.id, count=5, status="FAILED", channel="sms")
    notifications_insert_bulk(client_id=client.id, count=3, status="FAILED", channel="push")

    output = run("--status", "failed", "--channel", "sms", "--batch", "2")

    assert output.splitlines()[-1] == "done: retried 5 FAILED on sms notification(s) in 3 batch(es)"
    assert Notification.objects.filter(status=Status.FAILED, channel="push").count() == 3


def test_command_with_nothing_to_retry_says_so():
    assert run("--status", "DEAD_LETTERED") == (
        "done: retried 0 DEAD_LETTERED notification(s) in 0 batch(es)\n"
    )


def test_command_does_not_pick_up_a_row_it_already_retried_in_the_same_run():
    client = ClientFactory()
    notifications_insert_bulk(client_id=client.id, count=3)
    started = timezone.now()
    retries.notifications_retry_bulk(
        status="DEAD_LETTERED", operator="t", now=started, retried_before=started
    )
    # They failed again at once; the same run (same `retried_before`) must leave them.
    Notification.objects.update(status=Status.DEAD_LETTERED)
    again = retries.notifications_retry_bulk(
        status="DEAD_LETTERED", operator="t", now=timezone.now(), retried_before=started
    )
    assert (again.retried, again.remaining) == (0, 0)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--status", "SENT"], "--status must be DEAD_LETTERED or FAILED"),
        (["--status", "FAILED", "--channel", "fax"], "--channel must be one of"),
        (["--status", "FAILED", "--batch", "0"], "--batch must be between 1 and"),
    ],
)
def test_command_refuses_bad_input(args, message):
    with pytest.raises(CommandError, match=message):
        run(*args)
