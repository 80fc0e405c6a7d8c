"""PostgreSQL fails over mid-drain: the primary is stopped (`pg_ctl stop -m immediate`) while
clients create and workers deliver, and its streaming standby is promoted (`pg_ctl promote`).

Everything is real and of the test's own: two PostgreSQL servers in a temporary folder
(tests/support/replication.py, from the pgserver wheel's PostgreSQL 16 and Debian's 15 where
installed), gunicorn and two `run_worker` processes on libpq's multi-host URL
(`host=a,b`, `target_session_attrs=read-write`), an HTTP provider that counts idempotency keys
and a webhook receiver on 127.0.0.1. Clients keep creating (the thin path) and reading back
(DRF's path) through the gap, retrying a 503 with the same idempotency key, as a client would.

- Synchronous replication loses nothing: every create answered 201 (or 200) is there and
  SENT, the provider sent each once, each final state reached the webhook receiver under one
  event id, nothing was answered but 201, 200 and 503 (the JSON error with Retry-After), and
  the API and the workers, their wake-up listeners included, came back without a restart.
- Asynchronous replication loses what was committed after the standby's last received WAL
  and nothing before it. The test holds the replication link for a moment before the stop
  (what a slow link or a busy standby does) so that this moment is the test's to choose: every
  create answered before the standby had caught up is there, every create sent after the link
  was held is gone, and nothing else is. Still nothing is sent twice under two keys,
  and no event the new primary holds is lost; the webhooks the receiver got for what was lost
  all left after that moment.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import defaultdict
from dataclasses import dataclass, field

import psycopg
import pytest

from tests.faults.harness import Workers, wait_until
from tests.support.gunicorn_server import gunicorn_environment, gunicorn_serving
from tests.support.http_servers import ScriptedProvider
from tests.support.queue_table import QUEUE_COLUMNS, RECORD_COLUMNS
from tests.support.replication import (
    MigratedCluster,
    PrimaryAndStandby,
    postgres_builds,
    primary_and_standby,
)
from tests.support.webhook_receiver import WebhookReceiver

pytestmark = [pytest.mark.slow]

BUILDS = postgres_builds()


def builds_for(preferred: tuple[str, str]) -> list[str | None]:
    """Each mode runs once in the suite, on PostgreSQL 16 and 15 between the two modes where
    both are installed (about a minute); NOTIFYQUEUE_TEST_FAILOVER_EVERY_BUILD=1 runs each mode
    on every build found."""
    if os.environ.get("NOTIFYQUEUE_TEST_FAILOVER_EVERY_BUILD") == "1":
        return sorted(BUILDS) or [None]
    return [next((b for b in preferred if b in BUILDS), None)]


API_PROCESSES = 1
BACKLOG = 300
CREATORS = 4
WORKERS = 2
# The stop comes once this many were sent: mid-drain, the rest claimed, in flight or waiting.
SENT_BEFORE_STOP = 60
GAP_S = 1.0
# A claim outlives the gap, so most results kept through it are recorded, not taken over.
CLAIM_TIMEOUT_S = "4"
# A 503 says Retry-After: 1. These clients come back sooner, to see the gap in finer steps.
RETRY_S = 0.2


@dataclass
class Answer:
    key: str
    method: str
    status: int
    sent_at: float
    answered_at: float
    body: dict
    retry_after: str | None


@dataclass
class Traffic:
    """Every answer the clients got, and the notification each accepted key names."""

    answers: list[Answer] = field(default_factory=list)
    accepted: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)

    def record(self, answer: Answer) -> None:
        with self.lock:
            self.answers.append(answer)
            if answer.method == "POST" and answer.status in (200, 201):
                self.accepted[answer.key] = answer.body["id"]

    def created_since(self, at: float) -> int:
        with self.lock:
            return sum(
                1 for a in self.answers if a.method == "POST" and a.status == 201 and a.sent_at > at
            )


def call(base: str, api_key: str, method: str, path: str, body=None, **headers) -> Answer:
    request = urllib.request.Request(
        base + path,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Authorization": f"Api-Key {api_key}", "Content-Type": "application/json"}
        | headers,
    )
    sent_at = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status, raw, retry_after = response.status, response.read(), None
    except urllib.error.HTTPError as refused:
        status, raw = refused.code, refused.read()
        retry_after = refused.headers.get("Retry-After")
    return Answer(
        key=headers.get("Idempotency-Key", path),
        method=method,
        status=status,
        sent_at=sent_at,
        answered_at=time.monotonic(),
        body=json.loads(raw) if raw[:1] == b"{" else {"raw": raw[:200].decode(errors="replace")},
        retry_after=retry_after,
    )


def creator(base: str, api_key: str, traffic: Traffic, number: int) -> None:
    """Creates one notification at a time until told to stop, each sent again with its key
    after a 503 until it is answered; reads each back once it is."""
    while not traffic.stop.is_set():
        key = f"c{number}-{uuid.uuid4().hex}"
        body = {"channel": "email", "recipient": f"{key}@example.com", "subject": "s", "body": "b"}
        while True:
            answer = call(
                base, api_key, "POST", "/api/v1/notifications", body, **{"Idempotency-Key": key}
            )
            traffic.record(answer)
            if answer.status != 503:
                break
            time.sleep(RETRY_S)
        if answer.status in (200, 201):
            read = call(base, api_key, "GET", f"/api/v1/notifications/{answer.body['id']}")
            traffic.record(read)


def reader(base: str, api_key: str, traffic: Traffic, notification_id: str) -> None:
    """Reads one notification over and over (the long way: middleware, DRF, its
    authentication), so that reads meet the gap as well as creates."""
    while not traffic.stop.is_set():
        traffic.record(call(base, api_key, "GET", f"/api/v1/notifications/{notification_id}"))
        time.sleep(RETRY_S / 2)


@dataclass
class Outcome:
    """What the clients were answered, what the promoted standby holds, what the provider and
    the receiver saw, and when (time.monotonic()) each step of the failover happened."""

    traffic: Traffic
    provider: ScriptedProvider
    receiver: WebhookReceiver
    sent_at_stop: int = 0
    unfinished_at_stop: int = 0
    replicated_at: float = 0.0
    held_at: float = 0.0
    stopped_at: float = 0.0
    promoted_at: float = 0.0
    rows: dict[str, str] = field(default_factory=dict)
    sent_attempts: dict[str, int] = field(default_factory=dict)
    taken_over: set[str] = field(default_factory=set)
    event_ids: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    queue_differences: list = field(default_factory=list)
    worker_logs: str = ""
    api_output: str = ""


def failover(pair: PrimaryAndStandby, *, lag: bool) -> Outcome:
    """Runs the traffic, stops the primary mid-drain and promotes the standby. With `lag`,
    first waits until the standby has every WAL byte written so far, then holds the
    replication link until the clients have had five more creates answered."""
    api_output: list[str] = []
    with ScriptedProvider(delay_s=0.05) as provider, WebhookReceiver() as receiver:
        pair.client_webhook_set(receiver.url)
        env = gunicorn_environment(DATABASE_URL=pair.url)
        with Workers(
            pair.url, provider.url, NOTIFYQUEUE_CLAIM_TIMEOUT_SECONDS=CLAIM_TIMEOUT_S
        ) as workers:
            # Started first: they idle (LISTENing) while gunicorn starts.
            for _ in range(WORKERS):
                workers.start()
            with gunicorn_serving(env, workers=API_PROCESSES, threads=4, output=api_output) as base:
                outcome = Outcome(Traffic(), provider, receiver)
                _traffic_through_failover(pair, base, workers, outcome, lag=lag)
            workers.stop_all()
            outcome.worker_logs = _full_logs(workers)
            codes = [process.returncode for process in workers.processes]
            assert codes == [0] * WORKERS, outcome.worker_logs
        outcome.api_output = "".join(api_output)
        _read(pair, outcome)
    return outcome


def _traffic_through_failover(pair, base, workers, outcome: Outcome, *, lag: bool) -> None:
    traffic = outcome.traffic
    backlog_create(base, pair.template.api_key, traffic)
    api_key, first = pair.template.api_key, next(iter(traffic.accepted.values()))
    threads = [
        threading.Thread(target=creator, args=(base, api_key, traffic, n)) for n in range(CREATORS)
    ]
    threads.append(threading.Thread(target=reader, args=(base, api_key, traffic, first)))
    for thread in threads:
        thread.start()
    try:
        with psycopg.connect(pair.primary.url, autocommit=True) as conn:

            def counts() -> tuple[int, int]:
                return conn.execute(
                    "SELECT count(*) FILTER (WHERE status = 'SENT'), "
                    "count(*) FILTER (WHERE status <> 'SENT') FROM notification"
                ).fetchone()

            wait_until(lambda: counts()[0] >= SENT_BEFORE_STOP, timeout_s=60, what="the drain")
            outcome.sent_at_stop, outcome.unfinished_at_stop = counts()
        if lag:
            _, outcome.replicated_at = pair.replicated_to()
            pair.link.hold()
            outcome.held_at = time.monotonic()
            wait_until(
                lambda: traffic.created_since(outcome.held_at) >= 5,
                timeout_s=30,
                what="creates committed on the primary alone",
            )
        pair.stop_primary()
        outcome.stopped_at = time.monotonic()
        time.sleep(GAP_S)
        pair.promote()
        outcome.promoted_at = time.monotonic()
        wait_until(
            lambda: traffic.created_since(outcome.promoted_at) >= 2 * CREATORS,
            timeout_s=60,
            what="creates answered after the promotion",
        )
    finally:
        traffic.stop.set()
        for thread in threads:
            thread.join(60)
    with psycopg.connect(pair.url, autocommit=True) as conn:
        try:
            wait_until(
                lambda: _all_final(conn) and _webhooks_in(conn, outcome.receiver),
                timeout_s=60,
                what="every notification final and its webhook received",
            )
            # Each worker's wake-up listener is LISTENing again, on the new primary.
            wait_until(
                lambda: _listening(conn) == WORKERS,
                timeout_s=30,
                what="the workers' LISTEN sessions on the new primary",
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{pair.logs()}\n{workers.logs()}") from None


def backlog_create(base: str, api_key: str, traffic: Traffic) -> None:
    """BACKLOG notifications in one batch request, before the clients start."""
    items = [
        {
            "idempotency_key": f"b{i}",
            "channel": "email",
            "recipient": f"b{i}@example.com",
            "subject": "s",
            "body": "b",
        }
        for i in range(BACKLOG)
    ]
    batch = call(base, api_key, "POST", "/api/v1/notifications/batch", {"notifications": items})
    assert batch.status == 200, batch
    for item, result in zip(items, batch.body["results"], strict=True):
        assert result["status"] == 201, result
        traffic.accepted[item["idempotency_key"]] = result["notification"]["id"]


def _all_final(conn) -> bool:
    (waiting,) = conn.execute(
        "SELECT count(*) FROM notification WHERE status NOT IN ('SENT', 'FAILED', 'DEAD_LETTERED')"
    ).fetchone()
    return waiting == 0


def _webhooks_in(conn, receiver: WebhookReceiver) -> bool:
    states = set(conn.execute("SELECT id::text, status FROM notification").fetchall())
    return states <= _reports(receiver)


def _reports(receiver: WebhookReceiver) -> set[tuple[str, str]]:
    return {(e["jobId"], e["status"]) for e in (json.loads(r.body) for r in receiver.requests)}


def _listening(conn) -> int:
    (count,) = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND query = 'LISTEN notifyqueue_due' AND pid <> pg_backend_pid()"
    ).fetchone()
    return count


def _full_logs(workers: Workers) -> str:
    logs = []
    for process in workers.processes:
        process.log.seek(0)
        logs.append(f"--- pid {process.pid} ---\n{process.log.read()}")
    return "\n".join(logs)


def _read(pair: PrimaryAndStandby, outcome: Outcome) -> None:
    with psycopg.connect(pair.url, autocommit=True) as conn:
        outcome.rows = dict(conn.execute("SELECT id::text, status FROM notification").fetchall())
        outcome.sent_attempts = dict(
            conn.execute(
                "SELECT notification_id::text, count(*) FROM delivery_attempt "
                "WHERE outcome = 'SENT' GROUP BY 1"
            ).fetchall()
        )
        outcome.taken_over = {
            i
            for (i,) in conn.execute(
                "SELECT DISTINCT notification_id::text FROM delivery_attempt "
                "WHERE outcome = 'ABANDONED'"
            ).fetchall()
        }
        event_ids: dict[tuple[str, str], set[str]] = defaultdict(set)
        for event_id, job, status in conn.execute(
            "SELECT id::text, notification_id::text, status FROM webhook_event"
        ).fetchall():
            event_ids[(job, status)].add(event_id)
        outcome.event_ids = dict(event_ids)
        record = f"SELECT {RECORD_COLUMNS} FROM notification WHERE status <> 'SENT'"
        queue = f"SELECT {QUEUE_COLUMNS} FROM notification_queue"
        outcome.queue_differences = conn.execute(
            f"({record} EXCEPT ALL {queue}) UNION ALL ({queue} EXCEPT ALL {record})"
        ).fetchall()


def received_event_ids(receiver: WebhookReceiver) -> dict[tuple[str, str], set[str]]:
    received: dict[tuple[str, str], set[str]] = defaultdict(set)
    for request in receiver.requests:
        event = json.loads(request.body)
        received[(event["jobId"], event["status"])].add(event["eventId"])
    return dict(received)


def check_answers(outcome: Outcome, *, lost: frozenset[str] = frozenset()) -> list[Answer]:
    """Every answer was a success or a 503 in the JSON error format with Retry-After (or a
    404 to a read of a notification that was `lost`); the gap was seen (503s) and ended
    without a restart (successes after the promotion, from the same gunicorn processes).
    Returns the 503s."""
    answers = outcome.traffic.answers
    unexpected = [
        a
        for a in answers
        if a.status not in (200, 201, 503)
        and not (a.status == 404 and a.method == "GET" and a.key.rsplit("/", 1)[-1] in lost)
    ]
    assert not unexpected, unexpected[:5]
    refused = [a for a in answers if a.status == 503]
    assert {a.method for a in refused} == {"POST", "GET"}, "no request met the gap"
    for answer in refused:
        assert answer.body["error"]["code"] == "database_unavailable", answer
        assert set(answer.body["error"]) == {"code", "message", "fields"}, answer
        assert answer.retry_after == "1", answer
    after = [a for a in answers if a.sent_at > outcome.promoted_at and a.status in (200, 201)]
    assert {a.method for a in after} == {"POST", "GET"}, after[:5]
    # The same gunicorn processes all along: none died and was replaced.
    assert outcome.api_output.count("Booting worker") == API_PROCESSES, outcome.api_output[-3000:]
    return refused


def summary(pair, outcome: Outcome, refused: list[Answer], again: set[str]) -> str:
    """What the run saw, for the test's output (-s)."""
    successes = [a for a in outcome.traffic.answers if a.status in (200, 201)]
    first_after = min(a.answered_at for a in successes if a.sent_at > outcome.stopped_at)
    replays = {a.key for a in outcome.traffic.answers if a.status == 200 and a.method == "POST"}
    return (
        f"\n{pair.version}: {len(outcome.rows)} notifications; at the stop {outcome.sent_at_stop} "
        f"SENT, {outcome.unfinished_at_stop} not; {len(refused)} answers 503; the API answered "
        f"again {first_after - outcome.stopped_at:.2f} s after the stop "
        f"({first_after - outcome.promoted_at:.2f} s after the promotion); creates answered "
        f"200 (committed, answer lost): {len(replays)}; provider calls repeating a sent key: "
        f"{len(again)}; claims taken over: {len(outcome.taken_over)}; webhook POSTs "
        f"{len(outcome.receiver.requests)} for {len(outcome.event_ids)} events"
    )


@pytest.fixture(scope="module")
def migrated():
    """One migrated cluster per PostgreSQL build, made on first use and copied by each test."""
    made: dict[str, MigratedCluster] = {}

    def get(build: str) -> MigratedCluster:
        if build not in made:
            made[build] = MigratedCluster(BUILDS[build]).build()
        return made[build]

    yield get
    for cluster in made.values():
        cluster.close()


def check_workers_came_back(outcome: Outcome) -> None:
    """Each worker's loop, webhook sender and wake-up listener reconnected by themselves
    (they say so in their logs, and their LISTEN sessions were on the new primary)."""
    logs = outcome.worker_logs
    assert logs.count("wake-up listener reconnected") >= WORKERS, logs[-5000:]
    # The loop and the webhook sender of each: the outage ended, and was logged once (its
    # first failure's traceback), not once a retry; so was the heartbeat's, if a beat fell in
    # the gap, and an upkeep step (a statistics refresh) that did says so once. Logged once a
    # retry, two workers wrote 148 tracebacks in a gap of 1.4 s.
    assert logs.count(": database answers again after") >= 2 * WORKERS, logs[-5000:]
    errors = [line for line in logs.splitlines() if " ERROR " in line]
    assert len(errors) <= 5 * WORKERS, errors
    for each in ("delivery loop", "webhook sender", "heartbeat"):
        firsts = [line for line in errors if each in line and "database error" in line]
        assert len(firsts) <= WORKERS, firsts


@pytest.mark.skipif(not BUILDS, reason="no PostgreSQL programs (pgserver, or Debian's 15)")
@pytest.mark.parametrize("build", builds_for(("pgserver", "debian-15")))
def test_synchronous_failover_mid_drain_loses_nothing_and_sends_each_once(build, migrated):
    with primary_and_standby(migrated(build), synchronous=True) as pair:
        outcome = failover(pair, lag=False)

    context = f"{pair.version}\n{outcome.worker_logs[-6000:]}"
    assert outcome.sent_at_stop > 0 and outcome.unfinished_at_stop > 0, "not mid-drain"
    refused = check_answers(outcome)
    check_workers_came_back(outcome)
    accepted = set(outcome.traffic.accepted.values())
    # Every create answered 201 (or 200, a replay) is there, SENT, with one SENT attempt.
    assert accepted <= set(outcome.rows), sorted(accepted - set(outcome.rows))[:5]
    assert set(outcome.rows) == accepted, "a row no client was answered for"
    assert set(outcome.rows.values()) == {"SENT"}, context
    assert outcome.sent_attempts == dict.fromkeys(accepted, 1), context
    # The provider sent each once, under its own key, and was asked about no other key; it
    # was asked again with a key it had already sent only for a claim that expired in the
    # gap and was taken over (it answered as the first time and sent nothing).
    keys = {f"{i}:email" for i in accepted}
    assert set(outcome.provider.sends) == keys
    assert {c.key for c in outcome.provider.calls} == keys
    calls = defaultdict(int)
    for c in outcome.provider.calls:
        calls[c.key] += 1
    again = {key.split(":")[0] for key, n in calls.items() if n > 1}
    assert again <= outcome.taken_over, (sorted(again - outcome.taken_over)[:5], context)
    # Each final state has one event, and the receiver got it (at least once).
    assert set(outcome.event_ids) == {(i, "SENT") for i in accepted}
    assert all(len(ids) == 1 for ids in outcome.event_ids.values())
    assert received_event_ids(outcome.receiver) == outcome.event_ids
    assert not outcome.queue_differences, outcome.queue_differences[:3]
    print(summary(pair, outcome, refused, again))


@pytest.mark.skipif(not BUILDS, reason="no PostgreSQL programs (pgserver, or Debian's 15)")
@pytest.mark.parametrize("build", builds_for(("debian-15", "pgserver")))
def test_asynchronous_failover_loses_only_what_the_standby_had_not_received(build, migrated):
    with primary_and_standby(migrated(build), synchronous=False) as pair:
        outcome = failover(pair, lag=True)
    replicated_at, held_at = outcome.replicated_at, outcome.held_at

    context = f"{pair.version}\n{outcome.worker_logs[-6000:]}"
    answers = [a for a in outcome.traffic.answers if a.method == "POST" and a.status == 201]
    accepted = set(outcome.traffic.accepted.values())
    lost = accepted - set(outcome.rows)
    check_answers(outcome, lost=frozenset(lost))
    check_workers_came_back(outcome)
    # What the standby had before the link was held is all there (the backlog, and every
    # create answered before its WAL position was read); what was created after the link was
    # held is all gone; nothing else is.
    before = {a.body["id"] for a in answers if a.answered_at < replicated_at}
    after = {
        a.body["id"] for a in answers if held_at < a.sent_at and a.answered_at < outcome.stopped_at
    }
    batch = {i for k, i in outcome.traffic.accepted.items() if k.startswith("b")}
    assert not lost & (before | batch), sorted(lost & (before | batch))[:5]
    assert after <= lost, sorted(after - lost)[:5]
    assert after, "nothing was created while the link was held: nothing was tested"
    # What is there ends as it would have: final, one SENT attempt, no row nobody created.
    assert set(outcome.rows) <= accepted
    assert set(outcome.rows.values()) == {"SENT"}, context
    assert outcome.sent_attempts == dict.fromkeys(outcome.rows, 1), context
    # Nothing is sent twice under two keys: the provider saw only the keys of notifications
    # a client was answered for, sent each at most once (it keeps idempotency keys), and sent
    # each that is there. Calls repeating a key it had sent are the retries a provider
    # without idempotency keys (SMTP) would deliver twice.
    keys_there = {f"{i}:email" for i in outcome.rows}
    assert keys_there <= set(outcome.provider.sends)
    assert {c.key for c in outcome.provider.calls} <= {f"{i}:email" for i in accepted}
    # No event the new primary holds is lost; each reached the receiver. The receiver's
    # events the new primary does not hold (for a notification or a state that was lost)
    # all left after the standby's last received position was read.
    received = received_event_ids(outcome.receiver)
    for state, ids in outcome.event_ids.items():
        assert ids <= received.get(state, set()), state
    held = {e for ids in outcome.event_ids.values() for e in ids}
    extra = [r for r in outcome.receiver.requests if json.loads(r.body)["eventId"] not in held]
    assert all(r.at > replicated_at for r in extra)
    assert not outcome.queue_differences, outcome.queue_differences[:3]
    print(
        f"\n{pair.version}: accepted {len(accepted)}, lost {len(lost)} (created while the link "
        f"was held: {len(after)}), provider sends for lost notifications "
        f"{sum(1 for i in lost if f'{i}:email' in outcome.provider.sends)}, "
        f"webhooks for lost states {len(extra)}"
    )
