"""`Authorization: Api-Key` on the create path: one query, nothing cached, database clock."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
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
