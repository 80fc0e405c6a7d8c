"""`Authorization: Api-Key` on the create path: one query, nothing cached, database clock."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.test import APIClient

from clients import authentication
from clients.models import ClientAPIKey
from notifications.models import Notification
from tests.support.statements import statements_sent

pytestmark = pytest.mark.django_db

URL = "/api/v1/notifications"
VALID = {"channel": "email", "recipient": "ada@example.com", "body": "Welcome"}


def create(api: APIClient, key: str):
    return api.post(URL, VALID, format="json", HTTP_IDEMPOTENCY_KEY=key)


def test_a_revoked_key_fails_on_its_very_next_request(api, acme):
    assert create(api, "k-1").status_code == 201
    ClientAPIKey.objects.filter(client=acme[0]).update(revoked=True)
    response = create(api, "k-2")
    assert response.status_code == 401
    assert response.json()["error"]["message"] == "Unknown or revoked API key."


def test_a_known_prefix_with_a_wrong_secret_is_refused(acme):
    prefix = acme[1].partition(".")[0]
    http = APIClient()
    http.credentials(HTTP_AUTHORIZATION=f"Api-Key {prefix}.not-the-secret")
    assert create(http, "k-1").status_code == 401


def test_expiry_is_decided_by_the_database_clock(api, acme):
    keys = ClientAPIKey.objects.filter(client=acme[0])
    keys.update(expiry_date=timezone.now() + timedelta(hours=1))
    assert create(api, "k-1").status_code == 201
    with connection.cursor() as cursor:
        # The database's clock moves two hours on (this test's transaction only).
        cursor.execute(
            "CREATE OR REPLACE FUNCTION notifyqueue_now() RETURNS timestamptz "
            "LANGUAGE sql STABLE AS $$ SELECT statement_timestamp() + interval '2 hours' $$"
        )
    response = create(api, "k-2")
    assert response.status_code == 401
    assert response.json()["error"]["message"] == "This API key has expired."


def test_a_create_is_one_statement_once_its_key_is_known(api, settings):
    settings.NOTIFYQUEUE_API_RATE_LIMIT = 0  # the throttle's own count is not this test's
    create(api, "warm-up")  # the backlog figure is counted once per interval, not per create
    with statements_sent() as sent:
        assert create(api, "k-1").status_code == 201
    assert len(sent) == 1, sent
    # The function that checks the key and inserts (notifications/sql/functions/).
    assert "FROM notification_create_checked(" in sent[0]


def test_a_key_not_seen_before_is_looked_up_then_the_insert(api, settings):
    settings.NOTIFYQUEUE_API_RATE_LIMIT = 0
    create(api, "warm-up")
    authentication._REMEMBERED.clear()  # as in a process that has not seen this key yet
    with statements_sent() as sent:
        assert create(api, "k-1").status_code == 201
    assert len(sent) == 2, sent
    assert "FROM clients_clientapikey" in sent[0]
    assert "INSERT INTO notification" in sent[1]
    assert "clients_clientapikey" not in sent[1]


def test_a_critical_create_reads_the_permission_with_the_key(api, acme, settings):
    settings.NOTIFYQUEUE_API_RATE_LIMIT = 0
    acme[0].may_send_critical = True
    acme[0].save(update_fields=["may_send_critical"])
    create(api, "warm-up")
    with statements_sent() as sent:
        response = api.post(
            URL, {**VALID, "priority": "CRITICAL"}, format="json", HTTP_IDEMPOTENCY_KEY="k-1"
        )
    assert response.status_code == 201, response.json()
    # CRITICAL goes the long way: its permission is read with the key, before the insert.
    assert len(sent) == 2, sent
    assert "may_send_critical" in sent[0]


def test_a_known_key_revoked_since_is_refused_and_writes_nothing(api, acme, settings):
    settings.NOTIFYQUEUE_API_RATE_LIMIT = 0
    assert create(api, "k-1").status_code == 201
    ClientAPIKey.objects.filter(client=acme[0]).update(revoked=True)
    response = create(api, "k-2")
    assert response.status_code == 401
    assert not Notification.objects.filter(idempotency_key="k-2").exists()
    # Nor does a replay of k-1 answer with the notification.
    assert create(api, "k-1").status_code == 401


def _wrong_keys(key: str) -> dict[str, str]:
    prefix, _, secret = key.partition(".")
    last = "x" if secret[-1] != "x" else "y"
    return {
        "unknown prefix": f"Zz{prefix[2:]}.{secret}",
        "wrong secret": f"{prefix}.{'x' * len(secret)}",
        "secret wrong in its last character": f"{prefix}.{secret[:-1]}{last}",
    }


def _median_seconds(calls: dict, rounds: int) -> dict[str, float]:
    """Each call `rounds` times, interleaved (so load on the machine falls on all alike)."""
    import statistics
    import time

    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            started = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - started)
    return {name: statistics.median(spent) for name, spent in times.items()}


def test_checking_a_key_costs_the_same_whatever_is_wrong_with_it(acme):
    """An unknown prefix is checked against a made-up hash, so it costs what a wrong secret
    does; the secret is compared as a hash, so how much of it is right does not show."""
    generator = ClientAPIKey.objects.key_generator
    stored = ClientAPIKey.objects.get(client=acme[0]).hashed_key
    wrong = _wrong_keys(acme[1])

    def check(key: str):
        prefix = key.partition(".")[0]
        hashed = stored if acme[1].startswith(prefix + ".") else None
        return lambda: authentication._key_verified(key, hashed)

    assert not any(authentication._key_verified(k, None) for k in wrong.values())
    medians = _median_seconds({name: check(key) for name, key in wrong.items()}, rounds=2000)
    slowest, fastest = max(medians.values()), min(medians.values())
    assert slowest < fastest * 1.5, medians
    assert generator.verify(acme[1], stored)


def test_the_api_refuses_every_wrong_key_in_the_same_time(acme):
    """End to end (the key's row looked up, then checked): the medians stay within a fifth
    of each other."""
    headers = {name: f"Api-Key {key}" for name, key in _wrong_keys(acme[1]).items()}

    def refused(header: str) -> bool:
        try:
            authentication.api_key_authenticate(header)
        except AuthenticationFailed:
            return True
        return False

    calls = {name: (lambda header=header: refused(header)) for name, header in headers.items()}
    assert all(call() for call in calls.values())
    medians = _median_seconds(calls, rounds=300)
    assert max(medians.values()) < min(medians.values()) * 1.2, medians
