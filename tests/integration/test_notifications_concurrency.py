"""Races decided by PostgreSQL: each thread has its own connection, all start at one barrier."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone
from rest_framework.test import APIClient

from notifications.models import Notification, Status
from tests.support.factories import NotificationFactory
from tests.support.races import run_in_threads

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/api/v1/notifications"
THREADS = 25


def fire_together(key: str, bodies: list[dict], api_key: str) -> list[tuple[int, str]]:
    """POSTs every body at the same moment from its own thread; returns (status, id or code)."""

    def one(i: int, barrier) -> tuple[int, str]:
        http = APIClient()
        http.credentials(HTTP_AUTHORIZATION=f"Api-Key {api_key}")
        # Connect before the barrier so that connection setup does not spread the requests.
        connection.ensure_connection()
        barrier.wait(timeout=30)
        response = http.post(URL, bodies[i], format="json", HTTP_IDEMPOTENCY_KEY=key)
        data = response.json()
        return response.status_code, data.get("id") or data["error"]["code"]

    return run_in_threads(len(bodies), one)


def test_identical_concurrent_creates_make_exactly_one_row(acme):
    body = {"channel": "email", "recipient": "ada@example.com", "body": "Your code is 1"}
    results = fire_together("race-1", [body] * THREADS, acme[1])
    assert Counter(status for status, _ in results) == {201: 1, 200: THREADS - 1}
    assert len({notification_id for _, notification_id in results}) == 1
    assert Notification.objects.filter(idempotency_key="race-1").count() == 1


def test_concurrent_creates_with_one_key_and_different_bodies_make_one_row(acme):
    bodies = [
        {"channel": "email", "recipient": "ada@example.com", "body": f"Body {n}"}
        for n in range(THREADS)
    ]
    results = fire_together("race-2", bodies, acme[1])
    assert Counter(status for status, _ in results) == {201: 1, 409: THREADS - 1}
    assert {code for status, code in results if status == 409} == {"idempotency_key_reused"}
    assert Notification.objects.filter(idempotency_key="race-2").count() == 1


def test_cancel_waiting_on_a_workers_claim_loses_and_changes_nothing(acme, api):
    """A worker claims the row in an open transaction; the cancel blocks on the row lock, then
    sees PROCESSING and answers 409 without overwriting the claim."""
    row = NotificationFactory(client=acme[0])
    claimed, release = threading.Event(), threading.Event()

    def worker_claim() -> None:
        try:
            with transaction.atomic():
                updated = Notification.objects.filter(id=row.id, status=Status.PENDING).update(
                    status=Status.PROCESSING,
                    claim_token="0f8e2d7c-3b1a-4e59-8c6d-2a1b0c9d8e7f",
                    claimed_by="worker-test",
                    claim_expires_at=timezone.now() + timedelta(minutes=5),
                )
                assert updated == 1
                claimed.set()
                release.wait(timeout=30)
        finally:
            connections.close_all()

    def cancel() -> int:
        try:
            return api.post(f"{URL}/{row.id}/cancel").status_code
        finally:
            connection.close()

    worker = threading.Thread(target=worker_claim)
    worker.start()
    assert claimed.wait(timeout=30)
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending_cancel = pool.submit(cancel)
        # The cancel cannot finish while the claim's transaction holds the row.
        with pytest.raises(TimeoutError):
            pending_cancel.result(timeout=0.3)
        release.set()
        assert pending_cancel.result(timeout=30) == 409
    worker.join(timeout=30)
    row.refresh_from_db()
    assert (row.status, row.claimed_by) == (Status.PROCESSING, "worker-test")
