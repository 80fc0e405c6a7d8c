"""Webhook senders racing each other, dying mid-POST, and meeting uncommitted outbox rows.

These tests commit for real (transaction=True) and use separate connections, threads and a
separate process, because the guarantees are about what other sessions can see.
"""

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from django.conf import settings as django_settings
from django.db import connection

from tests.support.clock import DbClock
from tests.support.factories import ClientFactory, NotificationFactory
from tests.support.races import run_in_threads
from tests.support.webhook_factories import WebhookEventFactory
from tests.support.webhook_receiver import Reply, WebhookReceiver
from webhooks import repositories
from webhooks.models import AttemptOutcome, DeliveryState, WebhookEvent
from webhooks.sender import WebhookSender
from webhooks.services import webhook_events_deliver_due, webhook_events_reclaim_expired

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]

# The outbox INSERT as the delivery worker's finishing statement writes it (columns it names).
OUTBOX_INSERT = """
INSERT INTO webhook_event (id, client_id, notification_id, status, attempt_count, occurred_at,
                           state, delivery_attempts, next_attempt_at, created_at)
SELECT gen_random_uuid(), n.client_id, n.id, n.status, n.attempt_count, now(),
       'PENDING', 0, now(), now()
FROM notification AS n JOIN clients_client AS c ON c.id = n.client_id
WHERE n.id = %s AND c.webhook_url <> ''
"""


@pytest.fixture(autouse=True)
def webhook_settings(settings):
    settings.NOTIFYQUEUE_WEBHOOK_ALLOW_PRIVATE = True
    settings.NOTIFYQUEUE_WEBHOOK_TIMEOUT_SECONDS = 5.0
    return settings


@pytest.fixture
def receiver():
    with WebhookReceiver() as r:
        yield r


def test_concurrent_senders_post_each_event_exactly_once(receiver):
    client = ClientFactory(webhook_url=receiver.url)
    # A short pause per POST keeps claims in flight while the other senders poll.
    receiver.default = Reply(200, delay_s=0.01)
    events = {str(WebhookEventFactory(notification__client=client).id) for _ in range(50)}

    def sender(_, start) -> None:
        start.wait()
        while webhook_events_deliver_due(limit=3).claimed:
            pass

    run_in_threads(4, sender, timeout_s=60)
    seen = Counter(receiver.event_ids())
    assert set(seen) == events
    assert [eid for eid, n in seen.items() if n > 1] == []
    assert WebhookEvent.objects.filter(state=DeliveryState.DELIVERED).count() == 50


def test_claim_skips_events_locked_by_another_transaction(database_url):
    client = ClientFactory(webhook_url="http://127.0.0.1:9/unused")
    locked, free = (WebhookEventFactory(notification__client=client) for _ in range(2))
    with psycopg.connect(database_url) as other:
        other.execute("SELECT 1 FROM webhook_event WHERE id = %s FOR UPDATE", [locked.id])
        with connection.cursor() as cursor:
            # Without SKIP LOCKED the claim would wait for `other`; fail fast instead of hanging.
            cursor.execute("SET lock_timeout = '2s'")
        claimed = repositories.webhook_events_claim_due(limit=10, per_client=10, claim_timeout_s=30)
        other.rollback()
    assert [e.id for e in claimed] == [free.id]


def test_sender_never_sees_an_uncommitted_event_and_a_rollback_leaves_none(receiver, database_url):
    client = ClientFactory(webhook_url=receiver.url)
    notification = NotificationFactory(client=client, status="SENT", attempt_count=1)

    with psycopg.connect(database_url) as worker:
        worker.execute(OUTBOX_INSERT, [notification.id])
        assert webhook_events_deliver_due().claimed == 0
        worker.rollback()
    assert webhook_events_deliver_due().claimed == 0
    assert WebhookEvent.objects.count() == 0
    assert receiver.requests == []

    with psycopg.connect(database_url) as worker:
        worker.execute(OUTBOX_INSERT, [notification.id])
        worker.commit()
    assert webhook_events_deliver_due().delivered == 1
    event = WebhookEvent.objects.get()
    assert event.redeliveries == 0  # a database default the outbox INSERT need not name
    assert receiver.event_ids() == [str(event.id)]


SENDER_PROCESS = """
import django
django.setup()
from webhooks.services import webhook_events_deliver_due
webhook_events_deliver_due()
print("sender finished", flush=True)
"""


def test_sender_killed_after_the_post_leads_to_redelivery_with_the_same_event_id(
    receiver, database_url
):
    client = ClientFactory(webhook_url=receiver.url)
    event = WebhookEventFactory(notification__client=client)
    held = threading.Event()
    receiver.script(Reply(200, hold=held))
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "DJANGO_SETTINGS_MODULE": "notifyqueue.settings",
        "NOTIFYQUEUE_WEBHOOK_ALLOW_PRIVATE": "true",
    }
    sender = subprocess.Popen(
        [sys.executable, "-c", SENDER_PROCESS],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        receiver.wait_for(1, timeout_s=30)
        # The receiver has the POST; the sender waits for the answer and has recorded nothing.
        sender.send_signal(signal.SIGKILL)
        sender.wait(timeout=10)
    finally:
        if sender.poll() is None:
            sender.kill()
            sender.wait()
        held.set()
    stdout, stderr = sender.communicate()
    assert sender.returncode == -signal.SIGKILL, stderr.decode()
    assert b"sender finished" not in stdout

    event.refresh_from_db()
    assert event.state == DeliveryState.DELIVERING  # the claim was committed before the POST
    claim_timeout = timedelta(seconds=django_settings.NOTIFYQUEUE_WEBHOOK_CLAIM_TIMEOUT_SECONDS)
    assert event.claim_expires_at - event.attempts.get().started_at == claim_timeout
    assert webhook_events_reclaim_expired() == []
    DbClock(event.claim_expires_at)  # the conftest fixture restores the real clock
    (reclaimed,) = webhook_events_reclaim_expired()
    assert reclaimed.state == DeliveryState.PENDING
    assert webhook_events_deliver_due().delivered == 1

    first, second = receiver.wait_for(2)
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == str(event.id)
    assert first.body == second.body  # same event, same payload: the receiver dedups by eventId
    event.refresh_from_db()
    assert event.state == DeliveryState.DELIVERED
    assert list(event.attempts.order_by("number").values_list("outcome", flat=True)) == [
        AttemptOutcome.ABANDONED,
        AttemptOutcome.DELIVERED,
    ]


def test_a_hanging_endpoint_does_not_delay_another_clients_webhooks(settings):
    # Without the per-client cap, 40 events for a client whose endpoint answers after 8 s
    # (timeout 5 s) held another client's 5 events back for 24 s. Here scaled to a 1 s
    # timeout and a 2 s answer.
    settings.NOTIFYQUEUE_WEBHOOK_TIMEOUT_SECONDS = 1.0
    settings.NOTIFYQUEUE_WEBHOOK_CONCURRENCY = 8
    settings.NOTIFYQUEUE_WEBHOOK_CLIENT_CONCURRENCY = 4
    settings.NOTIFYQUEUE_WEBHOOK_BATCH_SIZE = 16
    with WebhookReceiver(default=Reply(200, delay_s=2.0)) as hanging, WebhookReceiver() as healthy:
        slow_client = ClientFactory(webhook_url=hanging.url)
        fast_client = ClientFactory(webhook_url=healthy.url)
        for _ in range(40):
            WebhookEventFactory(notification__client=slow_client)
        for _ in range(5):
            WebhookEventFactory(notification__client=fast_client)
        sender = WebhookSender(poll_interval_s=0.05, reclaim_interval_s=60)
        started = time.monotonic()
        sender.start()
        try:
            arrivals = [r.at - started for r in healthy.wait_for(5, timeout_s=15)]
            hung_early = [r.at - started for r in hanging.requests if r.at - started < 0.9]
        finally:
            sender.stop()
            sender.join()

    print(
        f"healthy client's 5 events arrived after {max(arrivals):.3f}s; "
        f"hanging client had {len(hung_early)} POSTs open"
    )
    # Well inside one webhook timeout: the hanging client never held every slot.
    assert max(arrivals) < 0.5
    # The hanging endpoint is given its share (4 POSTs at once), not the whole sender.
    assert len(hung_early) == 4


def test_a_sender_that_cannot_write_its_results_retries_after_the_poll_interval(
    database_url, caplog
):
    """A POST ended but its result cannot be written: another session holds the event's row
    and every new session of the database gives up a lock after 10 ms. The sender keeps the
    result and tries again once a poll interval (0.25 s) has passed, not at once: a step that
    fails without waiting would be retried hundreds of times a second against a database
    refusing it. Once the row is free the result is written: DELIVERED after one POST. The
    sender's outage line counts the steps that failed (notifyqueue/outage.py)."""
    name = connection.settings_dict["NAME"]
    with (
        WebhookReceiver(default=Reply(200, delay_s=0.5)) as receiver,
        psycopg.connect(database_url, autocommit=True) as admin,
    ):
        event = WebhookEventFactory(notification__client=ClientFactory(webhook_url=receiver.url))
        admin.execute(f"ALTER DATABASE \"{name}\" SET lock_timeout = '10ms'")
        sender = WebhookSender(poll_interval_s=0.25, reclaim_interval_s=60)
        try:
            with psycopg.connect(database_url) as holder:
                sender.start()
                receiver.wait_for(1)  # the POST is in flight, answered after 0.5 s
                holder.execute("SELECT 1 FROM webhook_event WHERE id = %s FOR UPDATE", [event.id])
                time.sleep(2.0)
                holder.rollback()
            deadline = time.monotonic() + 5
            while WebhookEvent.objects.get(id=event.id).state != DeliveryState.DELIVERED:
                assert time.monotonic() < deadline, "the kept result was never written"
                time.sleep(0.05)
        finally:
            sender.stop()
            sender.join()
            admin.execute(f'ALTER DATABASE "{name}" RESET lock_timeout')
    ended = [
        re.fullmatch(
            r"webhook sender: database answers again after [\d.]+s \((\d+) steps failed\)", m
        )
        for m in (r.getMessage() for r in caplog.records)
        if m.startswith("webhook sender: database answers again")
    ]
    assert len(ended) == 1 and ended[0], [r.getMessage() for r in caplog.records]
    # About 1.5 s of failing steps, one a poll interval.
    assert 2 <= int(ended[0][1]) <= 9, ended[0][0]
    assert len(receiver.requests) == 1


def test_a_client_has_at_most_its_post_slots_open_while_its_sender_claims_ahead(settings):
    """The sender claims several rounds of a client's POST slots at once (as many 1 s POSTs
    as fit in the 10 s claim timeout less one: 9 rounds of 2), yet while the client's first 2
    POSTs hang no third one opens; once they answer, every event arrives once."""
    settings.NOTIFYQUEUE_WEBHOOK_CLIENT_CONCURRENCY = 2
    settings.NOTIFYQUEUE_WEBHOOK_TIMEOUT_SECONDS = 1.0
    settings.NOTIFYQUEUE_WEBHOOK_CLAIM_TIMEOUT_SECONDS = 10.0
    held = threading.Event()
    with WebhookReceiver(default=Reply(200)) as receiver:
        receiver.script(Reply(200, hold=held), Reply(200, hold=held))
        client = ClientFactory(webhook_url=receiver.url)
        events = {str(WebhookEventFactory(notification__client=client).id) for _ in range(30)}
        sender = WebhookSender(poll_interval_s=0.05, reclaim_interval_s=60)
        sender.start()
        try:
            receiver.wait_for(2)
            time.sleep(0.3)
            assert len(receiver.requests) == 2
            assert WebhookEvent.objects.filter(state=DeliveryState.DELIVERING).count() == 18
            held.set()
            receiver.wait_for(30)
            sender.stop(drain=True)
            sender.join()
        finally:
            held.set()
            sender.stop()
            sender.join()
    assert Counter(receiver.event_ids()) == Counter(events)
    assert WebhookEvent.objects.filter(state=DeliveryState.DELIVERED).count() == 30


def test_a_client_whose_events_another_sender_holds_gets_no_claim_here():
    """One sender at a time holds a client's events: the POST slots of a client are one
    sender's, not one per sender. Another client's events are still claimed."""
    clients = [ClientFactory(webhook_url="http://127.0.0.1:9/unused") for _ in range(2)]
    for client in clients:
        WebhookEventFactory(notification__client=client)
        WebhookEventFactory(notification__client=client)
    params = {"limit": 10, "per_client": 10, "claim_timeout_s": 30}
    [first] = repositories.webhook_events_claim_due(**{**params, "limit": 1}, worker="w-1")
    held = first.client_id
    [other] = {c.id for c in clients} - {held}
    taken = repositories.webhook_events_claim_due(**params, worker="w-2")
    assert [e.client_id for e in taken] == [other, other]
    again = repositories.webhook_events_claim_due(**params, worker="w-1")
    assert [e.client_id for e in again] == [held]


def test_a_stopping_sender_gives_back_the_claims_it_never_posted(settings):
    """Claims waiting behind a client's open POSTs when the sender stops are given back
    unsent: PENDING, their attempt not counted, no attempt row; the POST that was open is
    recorded as usual."""
    settings.NOTIFYQUEUE_WEBHOOK_CLIENT_CONCURRENCY = 1
    held = threading.Event()
    with WebhookReceiver(default=Reply(200, hold=held)) as receiver:
        client = ClientFactory(webhook_url=receiver.url)
        for _ in range(5):
            WebhookEventFactory(notification__client=client)
        sender = WebhookSender(poll_interval_s=0.05, reclaim_interval_s=60)
        sender.start()
        receiver.wait_for(1)
        time.sleep(0.2)  # the first POST hangs; the other four wait for its slot
        sender.stop()
        held.set()
        sender.join()
    assert len(receiver.requests) == 1
    states = Counter(WebhookEvent.objects.values_list("state", flat=True))
    assert states == {DeliveryState.DELIVERED: 1, DeliveryState.PENDING: 4}
    waiting = WebhookEvent.objects.filter(state=DeliveryState.PENDING)
    assert set(waiting.values_list("delivery_attempts", flat=True)) == {0}
    assert sum(e.attempts.count() for e in waiting) == 0
    with connection.cursor() as cursor:
        cursor.execute("SELECT state, count(*) FROM webhook_queue GROUP BY state")
        assert cursor.fetchall() == [("PENDING", 4)]
