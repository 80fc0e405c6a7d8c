"""Expiry and cancellation by key tried as their enemies would: an expiry reached while the
provider holds the send, an expiry during a retry's backoff, workers whose hosts run an hour
off, a cancel racing ten workers and a slow provider, a cancel racing an operator's retry, and
100,000 notifications under one key cancelled while workers keep delivering. Each ends with the
universal check, which counts EXPIRED and CANCELLED as final and never sent."""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection, connections

from delivery.providers.http import HttpProvider
from delivery.services import RetryPolicy
from delivery.worker import Worker, WorkerConfig
from notifications import retries, services
from notifications.models import Notification, Status
from tests.faults.harness import (
    FINAL,
    Workers,
    all_final,
    faketime_library,
    notifications_create,
    universal_check,
    wait_until,
)
from tests.support.clock import database_now
from tests.support.factories import ClientFactory
from tests.support.http_servers import ScriptedProvider
from tests.support.operator_helpers import notifications_insert_bulk

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def keys_called(provider: ScriptedProvider, rows) -> set[str]:
    wanted = {f"{row.id}:{row.channel}" for row in rows}
    return {call.key for call in provider.calls} & wanted


def test_an_expiry_reached_mid_send_finishes_the_send_and_one_during_a_backoff_ends_it(
    database_url, client, webhooks
):
    """The provider takes 3 s a call (within the 5 s timeout here). Rows whose expiry passes
    while their send is in flight end SENT; a row whose first call failed (503) and whose
    expiry passes during its backoff (5-10 s) ends EXPIRED, asked once and never sent."""
    env = {
        "NOTIFYQUEUE_PROVIDER_TIMEOUT_SECONDS": "5",
        "NOTIFYQUEUE_CLAIM_TIMEOUT_SECONDS": "20",
        "NOTIFYQUEUE_BACKOFF_BASE_SECONDS": "5",
        "NOTIFYQUEUE_BACKOFF_MAX_SECONDS": "10",
    }
    with (
        ScriptedProvider(delay_s=3.0) as provider,
        Workers(database_url, provider.url, **env) as workers,
    ):
        workers.start()
        wait_until(lambda: workers._started(workers.processes[0]), timeout_s=60, what="start")
        now = database_now()
        mid_send = notifications_create(
            client,
            [f"slow{n}@example.com" for n in range(4)],
            expires_at=now + timedelta(seconds=1.5),
        )
        [backing_off] = notifications_create(
            client, ["busy@example.com"], expires_at=now + timedelta(seconds=4)
        )
        wait_until(all_final, timeout_s=60, what="every notification final")
        counts = universal_check(provider, workers, webhooks=webhooks)

    for row in mid_send:
        row.refresh_from_db()
        if row.status == Status.SENT:
            # Called before its expiry (database clock), answered after it: sent all the same.
            assert row.sent_at > row.expires_at
        else:  # a loaded machine claimed it only after its expiry: then it was never sent
            assert row.status == Status.EXPIRED and not keys_called(provider, [row])
    assert counts.get(Status.SENT, 0) >= 1, counts
    backing_off.refresh_from_db()
    assert (backing_off.status, backing_off.attempt_count) == (Status.EXPIRED, 1)
    assert [c.key for c in provider.calls if "busy" in c.recipient] == [f"{backing_off.id}:email"]


def test_workers_an_hour_fast_and_an_hour_slow_expire_by_the_database_clock(
    database_url, client, webhooks
):
    faketime_library()
    with ScriptedProvider() as provider, Workers(database_url, provider.url) as workers:
        now = database_now()
        # An hour fast, a worker deciding by its own clock would take these as expired.
        fresh = notifications_create(
            client,
            [f"fresh{n}@example.com" for n in range(6)],
            expires_at=now + timedelta(minutes=30),
        )
        # An hour slow, it would take these as still fresh: they expired a second ago.
        stale = notifications_create(
            client,
            [f"stale{n}@example.com" for n in range(6)],
            expires_at=now - timedelta(seconds=1),
        )
        due = now + timedelta(seconds=3)
        scheduled = notifications_create(
            client,
            ["later@example.com"],
            send_at=due,
            due_at=due,
            expires_at=due + timedelta(hours=2),
        )
        workers.start(faketime="+1h")
        workers.start(faketime="-1h")
        wait_until(all_final, timeout_s=60, what="every notification final")
        counts = universal_check(provider, workers, webhooks=webhooks)

    assert counts == {Status.SENT: len(fresh) + 1, Status.EXPIRED: len(stale)}
    assert not keys_called(provider, stale)
    assert provider.sends[f"{scheduled[0].id}:email"].at >= due.timestamp()


class ThreadWorkers:
    """In-process workers, each on a thread with its own database connection, standing in for
    `Workers` in the universal check (`stop_all`, `processes`, `logs`)."""

    def __init__(self, count: int, provider_url: str) -> None:
        self.processes: list = []
        self.workers = [
            Worker(
                providers={"email": HttpProvider(url=provider_url, timeout_s=5)},
                config=WorkerConfig(
                    concurrency=4,
                    batch_size=10,
                    claim_timeout_s=30,
                    send_timeout_s=5,
                    poll_interval_s=0.05,
                    heartbeat_s=0.2,
                ),
                policy=RetryPolicy(base_s=0.05, max_s=0.2),
            )
            for _ in range(count)
        ]
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._run, args=(w,)) for w in self.workers]

    def _run(self, worker: Worker) -> None:
        try:
            worker.run()
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            connections.close_all()

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop_all(self, timeout_s: float = 30) -> None:
        """Stops every worker and waits for its thread (again after the check: a no-op)."""
        for worker in self.workers:
            worker.stop()
        for thread in self.threads:
            if thread.ident is not None:
                thread.join(timeout_s)
        assert not any(thread.is_alive() for thread in self.threads)
        assert not self.errors, self.errors

    def logs(self) -> str:
        return ""


def test_a_cancel_by_key_racing_ten_workers_and_a_slow_provider(database_url, client):
    """Ten workers (threads, each its own connection) deliver 300 notifications under one
    key and 100 without, to a provider that takes 0.2 s a call; the client cancels the key
    while they run. Every row counted ends CANCELLED and was never sent; no send of the key
    starts after the answer; the rest end SENT."""
    with ScriptedProvider(delay_s=0.2) as provider:
        keyed = notifications_create(
            client, [f"k{n}@example.com" for n in range(300)], cancellation_key="campaign-9"
        )
        plain = notifications_create(client, [f"p{n}@example.com" for n in range(100)])
        workers = ThreadWorkers(10, provider.url)
        workers.start()
        try:
            wait_until(lambda: len(provider.calls) >= 40, timeout_s=60, what="sends under way")
            cancelled = services.notifications_cancel_by_key(
                client_id=client.id, cancellation_key="campaign-9"
            )
            answered = time.time()
            wait_until(all_final, timeout_s=120, what="every notification final")
            # In-process workers deliver no webhooks (run_worker's sender thread does): the
            # check leaves the events out.
            counts = universal_check(provider, workers)
        finally:
            workers.stop_all()

    statuses = dict(Notification.objects.values_list("id", "status"))
    gone = [row for row in keyed if statuses[row.id] == Status.CANCELLED]
    assert len(gone) == cancelled == counts[Status.CANCELLED]
    assert 0 < cancelled < len(keyed)  # the race was real: some had started, most had not
    assert not keys_called(provider, gone)  # never called, let alone sent
    assert {statuses[row.id] for row in plain} == {Status.SENT}
    # A send of the key that arrives after the answer must have started before it: within the
    # moment an HTTP request takes to arrive.
    late = [
        call
        for call in provider.calls
        if call.key in {f"{row.id}:email" for row in keyed} and call.at > answered + 0.5
    ]
    assert not late, late[:3]


def test_a_cancel_by_key_and_an_operator_retry_at_once(database_url, client, webhooks):
    """Dead letters under a key, an operator retrying every dead letter while the client
    cancels the key, with workers running: each row is either cancelled (and counted) or
    retried and sent, never both, never lost."""
    notifications_insert_bulk(client_id=client.id, count=200, status=Status.DEAD_LETTERED)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE notification SET cancellation_key = 'order-5'")
    with ScriptedProvider(delay_s=0.05) as provider, Workers(database_url, provider.url) as workers:
        workers.start()
        workers.start()
        barrier = threading.Barrier(2)
        answers: dict[str, int] = {}

        def retry() -> None:
            barrier.wait()
            answers["retried"] = retries.notifications_retry_bulk(
                status=Status.DEAD_LETTERED, channel=None, operator="test", now=database_now()
            ).retried
            connection.close()

        def cancel() -> None:
            barrier.wait()
            answers["cancelled"] = services.notifications_cancel_by_key(
                client_id=client.id, cancellation_key="order-5"
            )
            connection.close()

        threads = [threading.Thread(target=retry), threading.Thread(target=cancel)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        wait_until(all_final, timeout_s=60, what="every notification final")
        counts = universal_check(provider, workers, webhooks=webhooks)

    # Every dead letter was retried; what the cancel took after that is cancelled and counted,
    # what it found still dead-lettered (not cancellable) or already sending was sent.
    assert answers["retried"] == 200
    assert counts.get(Status.CANCELLED, 0) == answers["cancelled"]
    assert counts.get(Status.SENT, 0) + answers["cancelled"] == 200


def test_a_hundred_thousand_under_one_key_cancelled_while_workers_keep_delivering(database_url):
    """100,000 scheduled notifications under one key, 500 more under it due now, and a
    stream of others: the cancel takes every one of the key whose send had not started, in
    batches, while the workers go on claiming and sending the others (no batch holds its locks
    long enough to stall them). The client has no webhook: thousands of events would only
    measure the webhook sender, which other tests cover."""
    client = ClientFactory()
    later = database_now() + timedelta(hours=1)
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO notification (id, client_id, idempotency_key, request_fingerprint,
                channel, recipient, subject, body, priority, metadata, fallback_channels,
                status, send_at, due_at, attempt_count, max_attempts, operator_retries,
                created_at, updated_at, cancellation_key)
            SELECT gen_random_uuid(), %(client)s, 'bulk-' || g, md5(g::text), 'email',
                   'u' || g || '@example.com', 'Hi', 'Body', 2, '{}', '[]', 'PENDING',
                   %(later)s, %(later)s, 0, 6, 0, now(), now(), 'big-key'
              FROM generate_series(1, 100000) AS g
            """,
            {"client": client.id, "later": later},
        )
        cursor.execute("ANALYZE notification_queue")
    racing = notifications_create(
        client, [f"race{n}@example.com" for n in range(500)], cancellation_key="big-key"
    )
    with ScriptedProvider() as provider, Workers(database_url, provider.url) as workers:
        workers.start()
        workers.start()
        wait_until(lambda: len(provider.sends) >= 50, timeout_s=60, what="sends under way")
        others = []
        stop = threading.Event()

        def arrive() -> None:
            while not stop.is_set():
                # Each its own recipient: the rate limit (10 an hour) holds no one back.
                start = len(others)
                recipients = [f"other{start + n}@example.com" for n in range(5)]
                others.extend(notifications_create(client, recipients))
                time.sleep(0.1)
            connection.close()

        feeder = threading.Thread(target=arrive)
        feeder.start()
        started = time.time()
        try:
            cancelled = services.notifications_cancel_by_key(
                client_id=client.id, cancellation_key="big-key"
            )
        finally:
            finished = time.time()
            stop.set()
            feeder.join(30)
        try:
            wait_until(all_final, timeout_s=120, what="every notification final")
        except AssertionError as exc:
            left = Counter(
                Notification.objects.exclude(status__in=FINAL).values_list(
                    "status", "cancellation_key"
                )
            )
            raise AssertionError(f"{exc}: {left} cancelled={cancelled}\n{workers.logs()}") from None
        counts = universal_check(provider, workers)

    assert counts[Status.CANCELLED] == cancelled
    assert cancelled >= 100_000
    assert counts[Status.SENT] == len(others) + (len(racing) + 100_000 - cancelled)
    # The others kept being sent while the cancel ran (50 a second arrived): a batch's locks
    # last its one statement, so no long gap between two sends, on a machine busy enough that
    # a process may wait a second or two for a core.
    during = sorted(call.at for call in provider.sends.values() if started <= call.at <= finished)
    gaps = [b - a for a, b in zip([started, *during], [*during, finished], strict=True)]
    assert max(gaps) < 3.0, (max(gaps), finished - started, len(during))
