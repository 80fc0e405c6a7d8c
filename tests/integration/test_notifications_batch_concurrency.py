"""Batches racing each other and single creates over the same keys: PostgreSQL decides, each
key makes one row, and every answer says 201 (made it), 200 (same request) or 409 (not)."""

from __future__ import annotations

from collections import Counter

import pytest
from django.db import connection
from rest_framework.test import APIClient

from notifications.models import Notification
from tests.support.races import run_in_threads

pytestmark = pytest.mark.django_db(transaction=True)

BATCH_URL = "/api/v1/notifications/batch"
URL = "/api/v1/notifications"
KEYS = [f"race-{n}" for n in range(40)]


def item(key: str, body: str = "Same body") -> dict:
    return {
        "idempotency_key": key,
        "channel": "email",
        "recipient": "ada@example.com",
        "body": body,
    }


def run_together(calls, api_key: str) -> list:
    """Runs each call (a function of an APIClient) from its own thread and connection, all
    released at one barrier."""

    def one(i: int, barrier):
        http = APIClient()
        http.credentials(HTTP_AUTHORIZATION=f"Api-Key {api_key}")
        connection.ensure_connection()
        barrier.wait(timeout=30)
        return calls[i](http)

    return run_in_threads(len(calls), one)


def batch(items: list[dict]):
    def call(http: APIClient):
        response = http.post(BATCH_URL, {"notifications": items}, format="json")
        assert response.status_code == 200, response.json()
        return [
            (r["status"], r.get("notification", {}).get("id")) for r in response.json()["results"]
        ]

    return call


def test_identical_batches_racing_make_each_row_once(acme):
    results = run_together([batch([item(k) for k in KEYS])] * 6, acme[1])
    for n, key in enumerate(KEYS):
        answers = [result[n] for result in results]
        assert Counter(status for status, _ in answers) == {201: 1, 200: 5}, key
        assert len({notification_id for _, notification_id in answers}) == 1
    assert Notification.objects.filter(idempotency_key__in=KEYS).count() == len(KEYS)


def test_batches_with_different_bodies_for_one_key_answer_201_once_and_409_otherwise(acme):
    calls = [batch([item(k, body=f"Body {b}") for k in reversed(KEYS)]) for b in range(4)]
    results = run_together(calls, acme[1])
    for n in range(len(KEYS)):
        assert Counter(result[n][0] for result in results) == {201: 1, 409: 3}
    assert Notification.objects.filter(idempotency_key__in=KEYS).count() == len(KEYS)


def test_single_creates_racing_a_batch_over_the_same_keys(acme):
    def single(key: str):
        def call(http: APIClient):
            body = item(key)
            del body["idempotency_key"]
            response = http.post(URL, body, format="json", HTTP_IDEMPOTENCY_KEY=key)
            return response.status_code, response.json()["id"]

        return call

    keys = KEYS[:8]
    results = run_together([batch([item(k) for k in keys]), *(single(k) for k in keys)], acme[1])
    batched, singles = results[0], results[1:]
    for n in range(len(keys)):
        assert sorted([batched[n][0], singles[n][0]]) == [200, 201]
        assert batched[n][1] == singles[n][1]
    assert Notification.objects.filter(idempotency_key__in=keys).count() == len(keys)


def test_batches_with_the_same_keys_in_opposite_orders_never_deadlock(acme):
    """Each batch takes its keys' locks in one order (the keys'), not in the order its items
    came: two batches that meet on the same keys wait for each other instead of deadlocking."""
    for round_ in range(3):
        keys = [f"order-{round_}-{n}" for n in range(200)]
        forward = batch([item(k) for k in keys])
        backward = batch([item(k) for k in reversed(keys)])
        results = run_together([forward, backward, forward, backward], acme[1])
        for result in results:
            assert {status for status, _ in result} <= {200, 201}
        assert Notification.objects.filter(idempotency_key__in=keys).count() == len(keys)
