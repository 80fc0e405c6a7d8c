"""`GET /status` on real PostgreSQL: healthy, degraded, and with the database gone."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.db.migrations.loader import MigrationLoader
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from clients.models import Client, ClientAPIKey
from delivery.repositories import DeliveryRepository
from health.repositories import SQL, HealthRepository, PacedCounts
from notifications.models import Priority, Status
from tests.support.clock import DbClock
from tests.support.factories import ClientFactory, NotificationFactory
from tests.support.operator_helpers import notifications_insert_bulk
from tests.support.reads import history_read_whole
from tests.support.webhook_factories import WebhookEventFactory
from webhooks.models import DeliveryState

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]


def status():
    """/status as an operator sees it: with the details."""
    operator = Client.objects.get_or_create(name="status-operator", is_operator=True)[0]
    _, key = ClientAPIKey.objects.create_key(name="status", client=operator)
    response = APIClient().get("/status", HTTP_AUTHORIZATION=f"Api-Key {key}")
    return response.status_code, response.json()


def heartbeat(worker: str, *, seen_ago_s: float = 0.0) -> None:
    DbClock(timezone.now() - timedelta(seconds=seen_ago_s))
    DeliveryRepository().worker_heartbeat(worker=worker, hostname="host", pid=1, delivered=0)
    DbClock.restore()


def test_anonymous_status_says_healthy_or_not_and_nothing_else(make_client):
    assert APIClient().get("/status").json() == {"status": "ok"}
    NotificationFactory(send_at=timezone.now() - timedelta(minutes=5))
    anonymous = APIClient().get("/status")
    assert (anonymous.status_code, anonymous.json()) == (503, {"status": "degraded"})
    _, key = make_client("not-an-operator")
    plain = APIClient().get("/status", HTTP_AUTHORIZATION=f"Api-Key {key}")
    assert plain.json() == {"status": "degraded"}
    wrong = APIClient().get("/status", HTTP_AUTHORIZATION="Api-Key nope.nope")
    assert wrong.json() == {"status": "degraded"}


def test_an_anonymous_status_does_not_count_the_queue(make_client):
    # Anyone may ask, as often as they like: the answer must not cost a count of the backlog.
    notifications_insert_bulk(client_id=make_client()[0].id, count=50, status=Status.PENDING)
    heartbeat("worker-1")
    with CaptureQueriesContext(connection) as anonymous:
        assert APIClient().get("/status").status_code == 200
    with CaptureQueriesContext(connection) as operator:
        assert status()[0] == 200
    counting = "GROUP BY status, priority"
    assert counting in SQL["queue_depth"]
    assert not [q for q in anonymous.captured_queries if counting in q["sql"]]
    assert [q for q in operator.captured_queries if counting in q["sql"]]


def test_the_metrics_token_shows_the_details(settings):
    settings.NOTIFYQUEUE_METRICS_TOKEN = "s3cret"
    body = APIClient().get("/status", HTTP_AUTHORIZATION="Bearer s3cret").json()
    assert body["database"] == {"reachable": True}
    assert APIClient().get("/status", HTTP_AUTHORIZATION="Bearer other").json() == {"status": "ok"}


def test_an_empty_system_is_healthy():
    code, body = status()
    assert code == 200
    assert body["status"] == "ok"
    assert body["reasons"] == []
    assert body["database"] == {"reachable": True}
    assert body["migrations"] == {"applied": True, "pending": []}
    assert body["queue"]["depth"] == {
        "PENDING": 0,
        "PROCESSING": 0,
        "FAILED": 0,
        "DEAD_LETTERED": 0,
    }


def test_overdue_work_and_no_live_worker_is_503_with_the_reason():
    NotificationFactory(due_at=timezone.now() - timedelta(minutes=2))

    code, body = status()

    assert code == 503
    assert body["status"] == "degraded"
    assert len(body["reasons"]) == 1
    assert body["reasons"][0].startswith("no live worker")
    assert body["queue"]["oldest_overdue_seconds"] >= 120
    assert body["workers"]["live"] == 0


def test_a_live_worker_makes_the_same_backlog_healthy():
    NotificationFactory(due_at=timezone.now() - timedelta(minutes=2))
    heartbeat("w1")

    code, body = status()

    assert code == 200
    assert body["workers"]["live"] == 1
    assert body["workers"]["last_seen_at"] is not None


def test_a_stale_or_stopped_worker_is_not_live(settings):
    """Live means what the takeover of claims means (worker_dead): a heartbeat within
    NOTIFYQUEUE_WORKER_DEAD_AFTER_SECONDS by the database's clock, and not stopped."""
    settings.NOTIFYQUEUE_WORKER_DEAD_AFTER_SECONDS = 15
    NotificationFactory(due_at=timezone.now() - timedelta(minutes=2))
    heartbeat("stale", seen_ago_s=16)  # dead: its claims would be taken over
    heartbeat("stopped")
    DeliveryRepository().worker_stopped(worker="stopped", delivered=0)

    code, body = status()

    assert code == 503
    assert body["workers"]["live"] == 0


def test_work_scheduled_for_later_is_not_overdue():
    NotificationFactory(due_at=timezone.now() + timedelta(hours=1))
    code, body = status()
    assert code == 200
    assert body["queue"]["oldest_overdue_seconds"] == 0


def test_depth_dead_letters_and_webhook_backlog_are_reported():
    client = ClientFactory()
    heartbeat("w1")
    NotificationFactory.create_batch(3, client=client, priority=Priority.HIGH)
    notifications_insert_bulk(client_id=client.id, count=4)
    notifications_insert_bulk(client_id=client.id, count=2, status="FAILED")
    WebhookEventFactory.create_batch(2, next_attempt_at=timezone.now() - timedelta(seconds=30))
    WebhookEventFactory(state=DeliveryState.DELIVERED)

    code, body = status()

    assert code == 200
    assert body["queue"]["depth"] == {
        "PENDING": 3,
        "PROCESSING": 0,
        "FAILED": 2,
        "DEAD_LETTERED": 4,
    }
    assert body["queue"]["dead_lettered"] == 4
    assert body["webhooks"]["pending"] == 2
    assert body["webhooks"]["delivering"] == 0
    assert body["webhooks"]["oldest_overdue_seconds"] >= 30


def test_final_statuses_are_estimated_from_planner_statistics():
    client = ClientFactory()
    notifications_insert_bulk(client_id=client.id, count=3000, status="SENT")
    notifications_insert_bulk(client_id=client.id, count=1000, status="CANCELLED")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE notification")

    _, body = status()

    estimated = body["queue"]["estimated_final"]
    assert estimated["SENT"] == pytest.approx(3000, rel=0.1)
    assert estimated["CANCELLED"] == pytest.approx(1000, rel=0.1)


def test_pending_migrations_are_found_and_make_status_degraded(monkeypatch):
    monkeypatch.setattr(HealthRepository, "_migrations_applied", False)
    # Forget the newest notifications migration (and the earlier ones it stands for, which a
    # database records in its place), as if the code were newer than the schema.
    loader = MigrationLoader(connection)
    (newest,) = [name for app, name in loader.graph.leaf_nodes() if app == "notifications"]
    names = [
        newest,
        *(name for _, name in loader.disk_migrations["notifications", newest].replaces),
    ]
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM django_migrations WHERE app = 'notifications' AND name = ANY(%s)", [names]
        )

    code, body = status()

    assert code == 503
    assert body["migrations"] == {"applied": False, "pending": [f"notifications.{newest}"]}


@pytest.mark.parametrize(
    "query", ["queue_depth", "pending_oldest_due", "webhook_backlog", "webhook_oldest_due"]
)
def test_status_queries_read_indexes_not_the_whole_notification_table(query):
    client = ClientFactory()
    notifications_insert_bulk(client_id=client.id, count=20_000, status="SENT")
    notifications_insert_bulk(client_id=client.id, count=20)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE notification")
        cursor.execute("ANALYZE notification_queue")
        cursor.execute("ANALYZE webhook_event")
        cursor.execute("EXPLAIN " + SQL[query], {"now": timezone.now()})
        plan = "\n".join(row[0] for row in cursor.fetchall())
    # The record (every notification ever made) is never read whole, nor the webhook events
    # (every event ever delivered); the queue tables hold only what is not final, which the
    # planner may rightly read whole.
    assert not history_read_whole(plan) and "Seq Scan on notification " not in plan, plan
    assert re.search(r"Seq Scan on webhook_event\b", plan) is None, plan


@pytest.mark.django_db(transaction=True)
def test_status_with_the_database_unreachable_is_503_and_names_it_without_its_text():
    """A separate process whose DATABASE_URL points at a port nothing listens on. Anonymous
    callers learn only that it is degraded; with the metrics token, the reason names the
    error's class but never the driver's text (hosts, users, database names)."""
    script = (
        "import django, json; django.setup(); "
        "from django.test import Client; "
        "a = Client().get('/status'); "
        "r = Client().get('/status', HTTP_AUTHORIZATION='Bearer t0ken'); "
        "print(json.dumps({'code': r.status_code, 'body': r.json(), 'anonymous': a.json()}))"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "notifyqueue.settings",
        "DATABASE_URL": "postgresql://nobody:x@127.0.0.1:9/none?connect_timeout=2",
        "NOTIFYQUEUE_METRICS_TOKEN": "t0ken",
    }
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["code"] == 503
    assert answer["body"]["status"] == "degraded"
    assert answer["body"]["database"]["reachable"] is False
    assert answer["body"]["reasons"][0].startswith("database unreachable")
    assert answer["anonymous"] == {"status": "degraded"}
    text = json.dumps(answer["body"])
    assert "127.0.0.1" not in text and "nobody" not in text and "connection" not in text


def test_status_counts_do_not_include_sent_rows():
    NotificationFactory(status=Status.SENT)
    _, body = status()
    assert sum(body["queue"]["depth"].values()) == 0


def test_open_circuits_are_listed_without_degrading_the_status():
    from delivery.circuits.models import CircuitBreaker

    now = timezone.now()
    CircuitBreaker.objects.create(
        name="email:http", state="OPEN", consecutive_failures=5, opened_at=now, updated_at=now
    )
    CircuitBreaker.objects.create(name="sms:simulated", state="CLOSED", updated_at=now)
    code, body = status()
    assert code == 200
    assert body["circuits"]["total"] == 2
    [open_circuit] = body["circuits"]["open"]
    assert (open_circuit["name"], open_circuit["state"]) == ("email:http", "OPEN")
    assert open_circuit["consecutive_failures"] == 5


class SlowClock:
    """A monotonic clock that moves `step` seconds each time it is read."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_a_count_that_took_long_is_reused_for_a_hundred_times_as_long():
    # Each count reads an index entry per counted row; one that took 10 ms or more is answered
    # again unread until 100 times as long has passed, so /status and /metrics asked in a loop
    # cost the database about 1 % of the time whatever the backlog.
    client = ClientFactory()
    clock = SlowClock(step=0.02)  # every count seems to take 20 ms: kept for 2 s
    repository = HealthRepository(counts=PacedCounts(clock=clock))

    def depth_and_webhooks():
        snapshot = repository.queue_snapshot(now=timezone.now(), worker_dead_after_s=30)
        return snapshot.depth_of("DEAD_LETTERED"), snapshot.webhook_backlog.get("PENDING", 0)

    notifications_insert_bulk(client_id=client.id, count=2)
    WebhookEventFactory()
    assert depth_and_webhooks() == (2, 1)
    notifications_insert_bulk(client_id=client.id, count=3, start=timezone.now())
    WebhookEventFactory()
    assert depth_and_webhooks() == (2, 1)  # 40 ms later: reused
    clock.now += 2.0
    assert depth_and_webhooks() == (5, 2)  # past 100 times what the counts took


def test_a_count_that_took_no_time_is_read_afresh_every_time():
    client = ClientFactory()
    repository = HealthRepository(counts=PacedCounts(clock=SlowClock(step=0.001)))
    for count in (1, 2, 3):
        notifications_insert_bulk(client_id=client.id, count=1, start=timezone.now())
        snapshot = repository.queue_snapshot(now=timezone.now(), worker_dead_after_s=30)
        assert snapshot.depth_of("DEAD_LETTERED") == count


def test_a_count_slowed_by_a_stall_is_not_reused_for_more_than_a_minute():
    client = ClientFactory()
    clock = SlowClock(step=1.0)  # a count that seems to take a second: 100 s, capped at 60
    repository = HealthRepository(counts=PacedCounts(clock=clock))

    def dead_lettered():
        now = timezone.now()
        return repository.queue_snapshot(now=now, worker_dead_after_s=30).depth_of("DEAD_LETTERED")

    notifications_insert_bulk(client_id=client.id, count=1)
    assert dead_lettered() == 1
    notifications_insert_bulk(client_id=client.id, count=1, start=timezone.now())
    clock.now += 50.0
    assert dead_lettered() == 1
    clock.now += 10.0
    assert dead_lettered() == 2
