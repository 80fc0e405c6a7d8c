"""`GET /metrics` and a worker's `--metrics-port`, read with prometheus_client's own parser."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from clients.models import Client
from notifications import retries
from notifications.models import Notification, Priority, Status
from tests.integration.test_worker import drain
from tests.support.delivery_helpers import FakeClock, worker_build
from tests.support.factories import ClientFactory, NotificationFactory
from tests.support.operator_helpers import notifications_insert_bulk
from tests.support.webhook_receiver import WebhookReceiver
from webhooks.services import webhook_events_deliver_due

ROOT = Path(__file__).resolve().parents[2]


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def scrape(**headers) -> dict[tuple[str, frozenset], float]:
    response = APIClient().get("/metrics", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    return samples(response.content.decode())


def value(scraped, name: str, **labels) -> float:
    return scraped.get((name, frozenset(labels.items())), 0.0)


@pytest.mark.django_db
def test_metrics_page_has_django_and_queue_metrics_and_parses():
    scraped = scrape()
    names = {name for name, _ in scraped}
    assert "django_http_requests_total_by_method_total" in names
    # django-prometheus' database backend (psycopg 3) counts this test's queries.
    assert value(scraped, "django_db_execute_total", alias="default", vendor="postgresql") > 0
    assert value(scraped, "notifyqueue_database_up") == 1
    assert "notifyqueue_queue_oldest_overdue_seconds" in names
    assert "notifyqueue_workers_live" in names


@pytest.mark.django_db
def test_per_view_request_series_count_each_request_under_its_own_labels(api):
    # monitoring.middleware keeps each labelled series it used: every request must still land
    # in the series of its own view, method and status, and only there.
    view = "notification-list"
    responses = "django_http_responses_total_by_status_view_method_total"
    before = scrape()
    body = {"channel": "email", "recipient": "ada@example.com", "body": "Hi"}
    for n in range(3):
        api.post("/api/v1/notifications", body, format="json", HTTP_IDEMPOTENCY_KEY=f"k-{n}")
    for _ in range(2):
        api.post(
            "/api/v1/notifications",
            {"channel": "pigeon"},
            format="json",
            HTTP_IDEMPOTENCY_KEY="bad",
        )
    api.get("/api/v1/notifications")
    after = scrape()

    def grew(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew(responses, status="201", view=view, method="POST") == 3
    assert grew(responses, status="400", view=view, method="POST") == 2
    assert grew(responses, status="200", view=view, method="GET") == 1
    assert (
        grew(
            "django_http_requests_total_by_view_transport_method_total",
            view=view,
            transport="http",
            method="POST",
        )
        == 5
    )


def test_the_per_view_series_cache_stops_growing_at_its_bound(monkeypatch):
    # The middleware's own cache of labelled series must not grow without end, whatever
    # label values reach it.
    from monitoring import middleware

    monkeypatch.setattr(middleware, "CHILDREN_KEPT", 5)
    after = middleware.PrometheusAfterMiddleware(lambda request: None)
    metric = after.metrics.requests_latency_by_view_method
    children = [after.label_metric(metric, None, view=f"v{n}", method="GET") for n in range(8)]

    assert len(after._children) == 5
    assert children[7] is metric.labels(view="v7", method="GET")  # still counted


@pytest.mark.django_db
def test_invented_http_methods_add_no_series_to_the_public_metrics(api):
    """Every method a client invents is counted under one label value, in every series: the
    public /metrics stays the same size however many methods are tried."""
    from monitoring.middleware import KNOWN_METHODS, UNKNOWN_METHOD

    http = APIClient()
    http.raise_request_exception = False
    for n in range(3):
        http.generic(f"WARMUP{n}", "/api/v1/notifications")
        http.generic(f"WARMUP{n}", "/status")
    scrape()
    before = scrape()
    for n in range(300):
        http.generic(f"INVENTED{n}", "/api/v1/notifications")
        http.generic(f"INVENTED{n}", "/status")
    after = scrape()

    methods = {dict(labels).get("method") for _, labels in after} - {None}
    assert methods <= KNOWN_METHODS | {UNKNOWN_METHOD}, sorted(methods)[:5]
    assert len(after) == len(before)
    latency = "django_http_requests_latency_seconds_by_view_method_count"
    assert (
        sum(
            count
            for (name, labels), count in after.items()
            if name == latency and ("method", UNKNOWN_METHOD) in labels
        )
        >= 600
    )


@pytest.mark.django_db
def test_queue_gauges_match_the_table_by_status_and_priority():
    client = ClientFactory()
    NotificationFactory.create_batch(2, client=client, priority=Priority.HIGH)
    NotificationFactory(client=client, priority=Priority.LOW)
    notifications_insert_bulk(client_id=client.id, count=5)
    NotificationFactory(client=client, status=Status.SENT)

    scraped = scrape()

    depth = "notifyqueue_queue_depth"
    assert value(scraped, depth, status="PENDING", priority="HIGH") == 2
    assert value(scraped, depth, status="PENDING", priority="LOW") == 1
    assert value(scraped, depth, status="DEAD_LETTERED", priority="NORMAL") == 5
    assert value(scraped, "notifyqueue_dead_letter_size") == 5
    assert not any(name == depth and ("status", "SENT") in labels for name, labels in scraped)


@pytest.mark.django_db(transaction=True)
def test_counters_move_as_notifications_are_created_delivered_and_retried(api, settings):
    settings.NOTIFYQUEUE_WEBHOOK_ALLOW_PRIVATE = True
    before = scrape()
    with WebhookReceiver() as receiver:
        _deliver_three(api, receiver.url)
    after = scrape()

    def moved(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("notifyqueue_notifications_created_total", channel="email") == 2
    assert moved("notifyqueue_notifications_created_total", channel="sms") == 1
    assert moved("notifyqueue_notifications_finished_total", channel="email", status="SENT") == 1
    assert moved("notifyqueue_notifications_finished_total", channel="email", status="FAILED") == 1
    assert moved("notifyqueue_notifications_finished_total", channel="sms", status="SENT") == 1
    histogram = "notifyqueue_delivery_attempt_duration_seconds_count"
    assert moved(histogram, channel="email", outcome="SENT") == 1
    assert moved(histogram, channel="email", outcome="PERMANENT_FAILURE") == 1
    assert moved("notifyqueue_notifications_retried_total", channel="email") == 1
    assert (
        moved("notifyqueue_webhook_deliveries_total", outcome="DELIVERED", state="DELIVERED") >= 3
    )


def _deliver_three(api, webhook_url: str) -> None:
    Client.objects.filter(name="acme").update(webhook_url=webhook_url)
    for key, channel, recipient in [
        ("m1", "email", "ada@example.com"),
        ("m2", "email", "permanent-failure@example.com"),
        ("m3", "sms", "+447700900123"),
    ]:
        response = api.post(
            "/api/v1/notifications",
            {"channel": channel, "recipient": recipient, "body": "hi"},
            format="json",
            HTTP_IDEMPOTENCY_KEY=key,
        )
        assert response.status_code == 201
    clock = FakeClock()
    worker = worker_build()
    try:
        drain(worker, clock)
    finally:
        worker.stop()
        worker._shutdown()
    failed = retries.notification_retry(
        notification_id=_id_of("m2"), operator="test", now=timezone.now()
    )
    assert failed.status == "PENDING"
    batch = webhook_events_deliver_due()
    assert batch.delivered == 3


def _id_of(key: str):
    return Notification.objects.get(idempotency_key=key).id


@pytest.mark.django_db
def test_metrics_can_require_a_bearer_token(settings):
    settings.NOTIFYQUEUE_METRICS_PUBLIC = False
    settings.NOTIFYQUEUE_METRICS_TOKEN = "s3cret"
    http = APIClient()

    assert http.get("/metrics").status_code == 401
    assert http.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert http.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret").status_code == 200

    settings.NOTIFYQUEUE_METRICS_TOKEN = ""
    assert http.get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 401


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.django_db(transaction=True)
def test_worker_serves_its_own_metrics_on_metrics_port(database_url):
    NotificationFactory.create_batch(3, client=ClientFactory())
    port = free_port()
    worker = subprocess.Popen(
        [sys.executable, "manage.py", "run_worker", "--metrics-port", str(port)],
        cwd=ROOT,
        env={
            **os.environ,
            "DATABASE_URL": database_url,
            "NOTIFYQUEUE_POLL_INTERVAL_SECONDS": "0.1",
            "NOTIFYQUEUE_HEARTBEAT_SECONDS": "0.2",
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        sent = 0.0
        while time.monotonic() < deadline and sent < 3:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    scraped = samples(r.read().decode())
                sent = value(
                    scraped,
                    "notifyqueue_notifications_finished_total",
                    channel="email",
                    status="SENT",
                )
            except OSError:
                pass
            time.sleep(0.1)
        assert sent == 3
        # Queue gauges come from the API's /metrics only, never once per worker.
        assert not any(name.startswith("notifyqueue_queue_depth") for name, _ in scraped)
    finally:
        worker.send_signal(signal.SIGTERM)
        output, _ = worker.communicate(timeout=30)
    assert worker.returncode == 0, output
    assert f"metrics on http://0.0.0.0:{port}/metrics" in output


@pytest.mark.django_db
def test_circuit_state_is_a_gauge_per_provider():
    import uuid

    from delivery.circuits.models import CircuitBreaker

    now = timezone.now()
    CircuitBreaker.objects.create(
        name="push:http", state="OPEN", consecutive_failures=7, opened_at=now, updated_at=now
    )
    CircuitBreaker.objects.create(
        name="email:simulated",
        state="HALF_OPEN",
        opened_at=now,
        probe_token=uuid.uuid4(),
        probe_expires_at=now,
        updated_at=now,
    )
    CircuitBreaker.objects.create(name="sms:simulated", state="CLOSED", updated_at=now)
    scraped = scrape()
    assert value(scraped, "notifyqueue_circuit_state", circuit="push:http") == 2
    assert value(scraped, "notifyqueue_circuit_state", circuit="email:simulated") == 1
    assert ("notifyqueue_circuit_state", frozenset({("circuit", "sms:simulated")})) in scraped
    assert value(scraped, "notifyqueue_circuit_state", circuit="sms:simulated") == 0
    assert value(scraped, "notifyqueue_circuit_consecutive_failures", circuit="push:http") == 7
