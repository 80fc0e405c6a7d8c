"""Operator retries through the API: one notification, and the bulk retry in batches."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone
from rest_framework.test import APIClient

from delivery.models import DeliveryAttempt
from delivery.repositories import DeliveryRepository
from notifications import retries
from notifications.models import Notification, Status
from tests.integration.test_worker import drain
from tests.support.delivery_helpers import FakeClock, worker_build
from tests.support.factories import ClientFactory, NotificationFactory
from tests.support.operator_helpers import notifications_insert_bulk
from tests.support.races import run_in_threads
from webhooks.models import WebhookEvent

BULK = "/api/v1/notifications/retry"


def retry_url(notification) -> str:
    return f"/api/v1/notifications/{notification.id}/retry"


@pytest.fixture
def operator(make_client):
    client, key = make_client("ops", is_operator=True)
    http = APIClient()
    http.credentials(HTTP_AUTHORIZATION=f"Api-Key {key}")
    http.operator_client = client
    return http


@pytest.mark.django_db
def test_retry_puts_a_dead_letter_back_to_pending_due_now_with_attempts_at_zero(operator, acme):
    owner, _ = acme
    dead = NotificationFactory(
        client=owner,
        status=Status.DEAD_LETTERED,
        attempt_count=6,
        last_error="provider answered 503: busy",
        due_at=timezone.now() - timedelta(days=1),
    )
    before = timezone.now()

    response = operator.post(retry_url(dead))

    assert response.status_code == 200, response.json()
    body = response.json()
    assert (body["status"], body["attempt_count"], body["operator_retries"]) == ("PENDING", 0, 1)
    assert body["last_error"] == "provider answered 503: busy"
    dead.refresh_from_db()
    assert dead.status == Status.PENDING
    assert before <= dead.due_at <= timezone.now()  # due now, by the database's clock
    assert dead.updated_at == dead.last_retried_at
    assert dead.last_retried_by == "api:ops"


@pytest.mark.django_db
def test_retry_of_a_failed_notification_counts_every_operator_retry(operator):
    failed = NotificationFactory(status=Status.FAILED, attempt_count=1, last_error="no such user")
    assert operator.post(retry_url(failed)).status_code == 200
    Notification.objects.filter(id=failed.id).update(status=Status.FAILED, attempt_count=1)

    assert operator.post(retry_url(failed)).json()["operator_retries"] == 2


@pytest.mark.django_db
@pytest.mark.parametrize(
    "status", [Status.PENDING, Status.SENT, Status.CANCELLED, Status.SUPPRESSED]
)
def test_retry_of_any_other_status_is_409_and_changes_nothing(operator, status):
    notification = NotificationFactory(status=status)
    before = Notification.objects.get(id=notification.id)

    response = operator.post(retry_url(notification))

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "not_retryable"
    assert response.json()["error"]["fields"] == {"status": [status]}
    after = Notification.objects.get(id=notification.id)
    assert (after.status, after.operator_retries, after.updated_at) == (
        before.status,
        0,
        before.updated_at,
    )


@pytest.mark.django_db
def test_retry_of_a_processing_notification_is_409_and_keeps_the_claim(operator):
    notification = NotificationFactory()
    (claim,) = DeliveryRepository().notification_claim_due(worker="w", limit=1, claim_timeout_s=30)
    assert operator.post(retry_url(notification)).status_code == 409
    notification.refresh_from_db()
    assert notification.status == Status.PROCESSING
    assert notification.claim_token == claim.claim_token
    assert DeliveryAttempt.objects.filter(notification=notification).count() == 1


@pytest.mark.django_db
def test_retry_unknown_or_malformed_id_is_404(operator):
    response = operator.post("/api/v1/notifications/00000000-0000-0000-0000-000000000000/retry")
    assert response.status_code == 404
    assert operator.post("/api/v1/notifications/not-a-uuid/retry").status_code == 404


@pytest.mark.django_db
def test_retry_endpoints_are_for_operators_only(api, acme):
    own = NotificationFactory(client=acme[0], status=Status.DEAD_LETTERED, attempt_count=6)

    single = api.post(retry_url(own))
    bulk = api.post(BULK, {"status": "DEAD_LETTERED"}, format="json")

    assert single.status_code == bulk.status_code == 403
    assert single.json()["error"]["code"] == "permission_denied"
    own.refresh_from_db()
    assert own.status == Status.DEAD_LETTERED
    assert APIClient().post(BULK, {"status": "DEAD_LETTERED"}, format="json").status_code == 401


@pytest.mark.django_db
def test_bulk_retry_of_2500_dead_letters_answers_1000_1500_then_1000_500_then_500_0(operator):
    client = ClientFactory()
    notifications_insert_bulk(client_id=client.id, count=2500)
    NotificationFactory(client=client, status=Status.FAILED)  # another status: left alone

    answers = [operator.post(BULK, {"status": "DEAD_LETTERED"}, format="json") for _ in range(4)]

    assert [r.status_code for r in answers] == [200] * 4
    assert [r.json() for r in answers] == [
        {"retried": 1000, "remaining": 1500},
        {"retried": 1000, "remaining": 500},
        {"retried": 500, "remaining": 0},
        {"retried": 0, "remaining": 0},
    ]
    rows = Notification.objects.filter(client=client)
    assert rows.filter(status=Status.PENDING, attempt_count=0, operator_retries=1).count() == 2500
    assert rows.filter(status=Status.FAILED, operator_retries=0).count() == 1
    assert set(rows.filter(status=Status.PENDING).values_list("last_retried_by", flat=True)) == {
        "api:ops"
    }


@pytest.mark.django_db
def test_bulk_retry_takes_the_oldest_first_and_only_the_channel_asked_for(operator):
    client = ClientFactory()
    notifications_insert_bulk(client_id=client.id, count=1200, channel="sms")
    notifications_insert_bulk(
        client_id=client.id, count=5, channel="email", start=timezone.now() - timedelta(days=9)
    )

    response = operator.post(BULK, {"status": "dead_lettered", "channel": "SMS"}, format="json")

    assert response.json() == {"retried": 1000, "remaining": 200}
    retried = Notification.objects.filter(status=Status.PENDING)
    assert set(retried.values_list("channel", flat=True)) == {"sms"}
    oldest_left = Notification.objects.filter(status=Status.DEAD_LETTERED, channel="sms")
    assert (
        retried.order_by("-created_at")[0].created_at
        < oldest_left.order_by("created_at")[0].created_at
    )


@pytest.mark.django_db
@pytest.mark.parametrize(
    "payload",
    [
        {},
        {"status": "SENT"},
        {"status": "PENDING"},
        {"status": "FAILED", "channel": "fax"},
        {"status": "FAILED", "limit": 5},
    ],
)
def test_bulk_retry_refuses_anything_but_a_retryable_status_and_a_channel(operator, payload):
    NotificationFactory(status=Status.SENT)
    response = operator.post(BULK, payload, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_request"
    assert Notification.objects.filter(operator_retries__gt=0).count() == 0


@pytest.mark.django_db(transaction=True)
def test_bulk_retry_skips_rows_another_retry_holds_locked():
    client = ClientFactory()
    notifications_insert_bulk(client_id=client.id, count=10)
    oldest = Notification.objects.order_by("created_at").values_list("id", flat=True)[:3]
    locked = list(oldest)
    holding, release = threading.Event(), threading.Event()

    def hold_locks():
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(
                    "SELECT id FROM notification WHERE id = ANY(%s) FOR UPDATE", [locked]
                )
                holding.set()
                release.wait(10)
        finally:
            connections.close_all()

    other = threading.Thread(target=hold_locks)
    other.start()
    try:
        assert holding.wait(10)
        result = retries.notifications_retry_bulk(
            status="DEAD_LETTERED", operator="test", now=timezone.now(), limit=5
        )
    finally:
        release.set()
        other.join()

    assert (result.retried, result.remaining) == (5, 5)
    retried = set(Notification.objects.filter(status=Status.PENDING).values_list("id", flat=True))
    assert retried.isdisjoint(locked)


@pytest.mark.django_db(transaction=True)
def test_two_operators_retrying_at_once_never_retry_the_same_row_twice():
    client = ClientFactory()
    notifications_insert_bulk(client_id=client.id, count=3000)

    def retry(i, barrier):
        retried = []
        barrier.wait()
        while True:
            result = retries.notifications_retry_bulk(
                status="DEAD_LETTERED", operator=f"op{i}", now=timezone.now(), limit=200
            )
            retried.append(result.retried)
            if result.retried == 0 and result.remaining == 0:
                return retried

    assert sum(sum(retried) for retried in run_in_threads(2, retry, timeout_s=60)) == 3000
    assert set(Notification.objects.values_list("operator_retries", flat=True)) == {1}
    assert set(Notification.objects.values_list("last_retried_by", flat=True)) == {"op0", "op1"}


@pytest.mark.django_db(transaction=True)
def test_retried_dead_letter_goes_around_again_and_a_second_webhook_reports_it(make_client):
    owner, _ = make_client("acme", webhook_url="https://hooks.example.com/notify")
    clock = FakeClock()
    notification = NotificationFactory(
        client=owner, recipient="always-temporary-failure@example.com"
    )
    worker = worker_build()
    try:
        drain(worker, clock)
        notification.refresh_from_db()
        assert (notification.status, notification.attempt_count) == (Status.DEAD_LETTERED, 6)
        assert WebhookEvent.objects.filter(notification=notification).count() == 1

        retried = retries.notification_retry(
            notification_id=notification.id, operator="admin:ops", now=clock()
        )
        assert (retried.status, retried.attempt_count, retried.operator_retries) == (
            "PENDING",
            0,
            1,
        )
        drain(worker, clock)
    finally:
        worker.stop()
        worker._shutdown()

    notification.refresh_from_db()
    assert (notification.status, notification.attempt_count) == (Status.DEAD_LETTERED, 6)
    assert notification.operator_retries == 1
    assert DeliveryAttempt.objects.filter(notification=notification).count() == 12
    events = WebhookEvent.objects.filter(notification=notification).order_by("occurred_at")
    assert [(e.status, e.attempt_count) for e in events] == [
        ("DEAD_LETTERED", 6),
        ("DEAD_LETTERED", 6),
    ]
    assert events[1].occurred_at > events[0].occurred_at


@pytest.mark.django_db
def test_schema_documents_both_retry_endpoints_with_their_answers_and_examples():
    schema = APIClient().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    single = schema["paths"]["/api/v1/notifications/{notification_id}/retry"]["post"]
    bulk = schema["paths"]["/api/v1/notifications/retry"]["post"]
    common = {"400", "401", "403", "406", "414", "429", "431", "503"}
    assert set(single["responses"]) == common | {"200", "404", "409"}
    assert set(bulk["responses"]) == common | {"200", "413", "415"}
    assert bulk["requestBody"]["content"]["application/json"]["examples"]
    assert bulk["responses"]["200"]["content"]["application/json"]["examples"]
