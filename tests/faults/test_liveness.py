"""Rescue by liveness with real `run_worker` processes and real HTTP servers: a worker killed
(SIGKILL) or frozen (SIGSTOP) while it holds notification or webhook claims loses them to
another worker within seconds of its heartbeat's dead-after, far below the claim timeout
(left at 300 s here); a frozen worker resumed afterwards records nothing over its successor
and sends none of the claims it lost; a worker whose provider takes 8 s, or whose every
database session is terminated, keeps its claims and nothing is sent twice. Each ends with the
universal check."""

from __future__ import annotations

import signal
import socket
import time
import urllib.request

import pytest
from django.db import connection

from delivery.models import DeliveryAttempt, Outcome
from notifications.models import Notification, Status
from tests.faults.harness import (
    Workers,
    all_final,
    notifications_create,
    universal_check,
    wait_until,
)
from tests.support.http_servers import ScriptedProvider
from tests.support.webhook_receiver import Reply
from webhooks.models import AttemptOutcome, DeliveryState, WebhookDeliveryAttempt, WebhookEvent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

HEARTBEAT_S = 1.0
DEAD_AFTER_S = 5.0
# A worker is taken over at its next peer's takeover after its heartbeat's dead-after: its last
# beat was up to a heartbeat before it stopped, and the peer's takeover runs every heartbeat.
# A second more for a loaded machine.
TAKEOVER_BOUND_S = DEAD_AFTER_S + 3 * HEARTBEAT_S
CLAIM_TIMEOUT_S = 300.0
LIVENESS_ENV = {
    "NOTIFYQUEUE_HEARTBEAT_SECONDS": str(HEARTBEAT_S),
    "NOTIFYQUEUE_WORKER_DEAD_AFTER_SECONDS": str(DEAD_AFTER_S),
    "NOTIFYQUEUE_CLAIM_TIMEOUT_SECONDS": str(CLAIM_TIMEOUT_S),
    "NOTIFYQUEUE_PROVIDER_TIMEOUT_SECONDS": "12",
    "NOTIFYQUEUE_WEBHOOK_TIMEOUT_SECONDS": "12",
    "NOTIFYQUEUE_WEBHOOK_CLAIM_TIMEOUT_SECONDS": str(CLAIM_TIMEOUT_S),
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rescued(port: int, kind: str, cause: str) -> float:
    """A worker's notifyqueue_claims_rescued_total{kind, cause} from its /metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    wanted = f'notifyqueue_claims_rescued_total{{cause="{cause}",kind="{kind}"}} '
    for line in text.splitlines():
        if line.startswith(wanted):
            return float(line.split()[-1])
    return 0.0


def started(workers: Workers, *processes) -> None:
    for process in processes:
        wait_until(lambda p=process: workers._started(p), timeout_s=60, what="a worker to start")


def processing_by(pid: int) -> set:
    return set(
        Notification.objects.filter(
            status=Status.PROCESSING, claimed_by__contains=f":{pid}:"
        ).values_list("id", flat=True)
    )


def last_seen_at(pid: int):
    with connection.cursor() as cursor:
        cursor.execute("SELECT last_seen_at FROM worker_heartbeat WHERE pid = %s", [pid])
        return cursor.fetchone()[0]


@pytest.mark.parametrize("fault", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "frozen"])
def test_a_dead_workers_notifications_are_sent_by_another_within_seconds(
    database_url, client, webhooks, fault
):
    """A holds six claims (four calls in flight on a 5 s provider, two waiting for a send
    thread) when it is killed or frozen. B, running, takes them over once A's heartbeat is
    DEAD_AFTER_S old and sends them, all well inside TAKEOVER_BOUND_S. Frozen, A is then
    resumed: its late answers change nothing, and it starts none of its two waiting claims."""
    port = free_port()
    with (
        ScriptedProvider(delay_s=5) as provider,
        Workers(database_url, provider.url, **LIVENESS_ENV) as workers,
    ):
        a = workers.start()
        b = workers.start("--concurrency", "8", "--metrics-port", str(port))
        started(workers, a, b)
        b.send_signal(signal.SIGSTOP)  # so A alone claims
        notifications_create(client, [f"user{i}@example.com" for i in range(6)])
        wait_until(
            lambda: len(processing_by(a.pid)) == 6 and len(provider.calls) >= 4,
            timeout_s=30,
            what="A to hold every claim, four of them at the provider",
        )
        held = processing_by(a.pid)
        a.send_signal(fault)
        stopped_at = time.monotonic()
        b.send_signal(signal.SIGCONT)
        wait_until(lambda: not processing_by(a.pid), timeout_s=60, what="A's claims taken over")
        taken_s = time.monotonic() - stopped_at
        wait_until(all_final, timeout_s=60, what="every notification final")
        final_s = time.monotonic() - stopped_at
        seen_at = last_seen_at(a.pid)
        if fault == signal.SIGSTOP:
            a.send_signal(signal.SIGCONT)
            # Its four calls answer and are recorded (stale); its two waiting claims would
            # be sent now if it still trusted them.
            time.sleep(3 * HEARTBEAT_S)
        from_b = rescued(port, "notification", "dead_worker")
        counts = universal_check(provider, workers, webhooks=webhooks)

    print(
        f"{signal.Signals(fault).name}: claims taken over {taken_s:.1f}s after, "
        f"all sent {final_s:.1f}s after (dead-after {DEAD_AFTER_S:g}s, claim timeout "
        f"{CLAIM_TIMEOUT_S:g}s)"
    )
    assert counts == {Status.SENT: 6}
    assert held == set(Notification.objects.values_list("id", flat=True))
    assert DEAD_AFTER_S - HEARTBEAT_S <= taken_s <= TAKEOVER_BOUND_S, taken_s
    abandoned = DeliveryAttempt.objects.filter(outcome=Outcome.ABANDONED)
    assert sorted(abandoned.values_list("error", flat=True)) == ["worker dead"] * 6
    # By the database's clock: taken over once A's heartbeat was DEAD_AFTER_S old, not before.
    for finished_at in abandoned.values_list("finished_at", flat=True):
        assert DEAD_AFTER_S <= (finished_at - seen_at).total_seconds() <= TAKEOVER_BOUND_S
    assert from_b == 6
    sent_by = set(
        DeliveryAttempt.objects.filter(outcome=Outcome.SENT).values_list("worker", flat=True)
    )
    assert len(sent_by) == 1 and f":{b.pid}:" in sent_by.pop()  # B's, never A's
    calls: dict[str, int] = {}
    for call in provider.calls:
        calls[call.key] = calls.get(call.key, 0) + 1
    # A called four keys; B called all six once. A frozen and resumed called no key again.
    assert sorted(calls.values()) == [1, 1, 2, 2, 2, 2], calls


def test_a_worker_whose_provider_takes_eight_seconds_keeps_its_claims(
    database_url, client, webhooks
):
    """Every call takes 8 s, longer than the 5 s dead-after: the heartbeat (its own thread,
    every second) keeps both workers alive, so no claim is taken over and the provider is
    called once per notification."""
    with (
        ScriptedProvider(delay_s=8) as provider,
        Workers(database_url, provider.url, **LIVENESS_ENV) as workers,
    ):
        a, b = workers.start(), workers.start()
        started(workers, a, b)
        notifications_create(client, [f"user{i}@example.com" for i in range(8)])
        wait_until(all_final, timeout_s=90, what="every notification final")
        counts = universal_check(provider, workers, webhooks=webhooks)

    assert counts == {Status.SENT: 8}
    keys = [call.key for call in provider.calls]
    assert len(keys) == len(set(keys)) == 8, keys  # no second call on any key
    assert not DeliveryAttempt.objects.filter(outcome=Outcome.ABANDONED).exists()


def test_terminated_sessions_heartbeats_included_send_nothing_twice(database_url, client, webhooks):
    """While both workers wait on a 4 s provider, every session they have is terminated
    (pg_terminate_backend) twice: the loop's, the heartbeat's, the listener's, the webhook
    sender's. The heartbeat reconnects within a second, nobody is taken for dead, and each
    notification is sent by one call."""
    with (
        ScriptedProvider(delay_s=4) as provider,
        Workers(database_url, provider.url, **LIVENESS_ENV) as workers,
    ):
        a, b = workers.start(), workers.start()
        started(workers, a, b)
        notifications_create(client, [f"user{i}@example.com" for i in range(8)])
        wait_until(lambda: len(provider.calls) >= 8, timeout_s=30, what="eight calls")
        for _ in range(2):
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                    "AND backend_type = 'client backend'"
                )
                assert cursor.fetchone()[0] >= 6  # each worker's loop, heartbeat, listener
            time.sleep(1.0)
        wait_until(all_final, timeout_s=60, what="every notification final")
        counts = universal_check(provider, workers, webhooks=webhooks)

    assert counts == {Status.SENT: 8}
    keys = [call.key for call in provider.calls]
    assert len(keys) == len(set(keys)) == 8, keys
    assert not DeliveryAttempt.objects.filter(outcome=Outcome.ABANDONED).exists()


@pytest.mark.parametrize("fault", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "frozen"])
def test_a_dead_workers_webhook_events_are_delivered_by_another_within_seconds(
    database_url, client, webhooks, fault
):
    """A's sender holds four webhook POSTs (the receiver answers its first four after 6 s)
    when A is killed or frozen: B takes the events over once A's heartbeat is DEAD_AFTER_S
    old and delivers them. Frozen, A is then resumed: its late results change nothing."""
    webhooks.script(*[Reply(delay_s=6)] * 4)
    with (
        ScriptedProvider() as provider,
        Workers(database_url, provider.url, **LIVENESS_ENV) as workers,
    ):
        a, b = workers.start(), workers.start()
        started(workers, a, b)
        b.send_signal(signal.SIGSTOP)
        notifications_create(client, [f"user{i}@example.com" for i in range(4)])
        wait_until(lambda: len(webhooks.requests) >= 4, timeout_s=30, what="A's four POSTs")
        held = set(
            WebhookEvent.objects.filter(
                state=DeliveryState.DELIVERING, claimed_by__contains=f":{a.pid}:"
            ).values_list("id", flat=True)
        )
        a.send_signal(fault)
        stopped_at = time.monotonic()
        b.send_signal(signal.SIGCONT)
        wait_until(
            lambda: WebhookEvent.objects.filter(state=DeliveryState.DELIVERED).count() == 4,
            timeout_s=60,
            what="every event delivered",
        )
        delivered_s = time.monotonic() - stopped_at
        if fault == signal.SIGSTOP:
            a.send_signal(signal.SIGCONT)
            time.sleep(3)  # its POSTs have their answers: it records them, stale
        universal_check(provider, workers, webhooks=webhooks)

    print(f"{signal.Signals(fault).name}: webhook events delivered {delivered_s:.1f}s after")
    assert len(held) == 4
    assert delivered_s <= TAKEOVER_BOUND_S + 2, delivered_s
    attempts = WebhookDeliveryAttempt.objects.all()
    abandoned = attempts.filter(outcome=AttemptOutcome.ABANDONED)
    assert set(abandoned.values_list("event_id", flat=True)) == held
    assert {a.error for a in abandoned} == {"claim taken over: the worker holding it is dead"}
    assert attempts.filter(outcome=AttemptOutcome.DELIVERED).count() == 4  # B's only
    assert not attempts.filter(finished_at__isnull=True).exists()
