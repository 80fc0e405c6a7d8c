"""Operator tools and per-client permissions: CRITICAL is a permission, the
admin issues and revokes client keys, create_client applies the webhook SSRF rule."""

from __future__ import annotations

import json
import re
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from clients.models import Client, ClientAPIKey
from notifications.models import Notification

pytestmark = pytest.mark.django_db

URL = "/api/v1/notifications"
CRITICAL = {"channel": "sms", "recipient": "+447700900123", "body": "x", "priority": "critical"}


def as_client(key: str) -> APIClient:
    http = APIClient()
    http.credentials(HTTP_AUTHORIZATION=f"Api-Key {key}")
    return http


def test_a_new_client_may_not_send_critical(api):
    response = api.post(URL, CRITICAL, format="json", HTTP_IDEMPOTENCY_KEY="k")
    assert response.status_code == 403
    error = response.json()["error"]
    assert error["code"] == "critical_not_allowed"
    assert "priority" in error["fields"]
    assert not Notification.objects.exists()


def test_a_client_with_the_permission_may(make_client):
    _, key = make_client("urgent", may_send_critical=True)
    response = as_client(key).post(URL, CRITICAL, format="json", HTTP_IDEMPOTENCY_KEY="k")
    assert response.status_code == 201
    assert response.json()["priority"] == "CRITICAL"


def test_other_priorities_need_no_permission(api):
    for n, priority in enumerate(["HIGH", "NORMAL", "LOW"]):
        body = {**CRITICAL, "priority": priority}
        assert api.post(URL, body, format="json", HTTP_IDEMPOTENCY_KEY=f"k{n}").status_code == 201


def test_a_batch_refuses_only_its_critical_items_without_the_permission(api):
    items = [
        {**CRITICAL, "idempotency_key": "a"},
        {**CRITICAL, "priority": "HIGH", "idempotency_key": "b"},
    ]
    response = api.post(f"{URL}/batch", {"notifications": items}, format="json")
    assert response.status_code == 200
    results = response.json()["results"]
    assert [r["status"] for r in results] == [403, 201]
    assert results[0]["error"]["code"] == "critical_not_allowed"
    assert Notification.objects.count() == 1


def test_create_client_defaults_to_no_critical_and_critical_grants_it():
    out = StringIO()
    call_command("create_client", "plain", stdout=out)
    call_command("create_client", "urgent", "--critical", stdout=StringIO())
    assert json.loads(out.getvalue())["client"] == "plain"
    assert Client.objects.get(name="plain").may_send_critical is False
    assert Client.objects.get(name="urgent").may_send_critical is True


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/hook",
        "http://localhost/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://10.0.0.5/hook",
        "ftp://example.com/hook",
        "not a url",
    ],
)
def test_create_client_refuses_a_webhook_url_the_ssrf_rule_refuses(settings, url):
    settings.NOTIFYQUEUE_WEBHOOK_ALLOW_PRIVATE = False
    with pytest.raises(CommandError, match="--webhook-url"):
        call_command("create_client", "hooked", "--webhook-url", url, stdout=StringIO())
    assert not Client.objects.filter(name="hooked").exists()


def test_create_client_takes_a_public_webhook_url_and_private_ones_when_allowed(settings):
    settings.NOTIFYQUEUE_WEBHOOK_ALLOW_PRIVATE = False
    call_command(
        "create_client", "public", "--webhook-url", "https://hooks.example.com/x", stdout=StringIO()
    )
    settings.NOTIFYQUEUE_WEBHOOK_ALLOW_PRIVATE = True
    call_command(
        "create_client", "local", "--webhook-url", "http://127.0.0.1:9/x", stdout=StringIO()
    )
    assert Client.objects.get(name="local").webhook_url == "http://127.0.0.1:9/x"


def test_the_admin_issues_a_key_that_authenticates_at_once(admin_client, acme):
    response = admin_client.post(
        "/admin/clients/clientapikey/add/",
        {"client": acme[0].id, "name": "issued in the admin"},
        follow=True,
    )
    assert response.status_code == 200
    message = next(str(m) for m in response.context["messages"])
    key = re.search(r"is: (\S+)\. ", message).group(1)
    assert as_client(key).get(URL).status_code == 200


def test_a_key_revoked_in_the_admin_fails_at_once(admin_client, acme):
    client, key = acme
    http = as_client(key)
    assert http.get(URL).status_code == 200
    api_key = ClientAPIKey.objects.get(client=client)
    response = admin_client.post(
        f"/admin/clients/clientapikey/{api_key.pk}/change/",
        {"name": api_key.name, "revoked": "on", "expiry_date_0": "", "expiry_date_1": ""},
    )
    assert response.status_code == 302, response.content[:500]
    refused = http.get(URL)
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "authentication_failed"


def test_the_revoke_action_revokes_every_selected_key(admin_client, acme, make_client):
    _, other_key = make_client("other")
    response = admin_client.post(
        "/admin/clients/clientapikey/",
        {
            "action": "revoke_selected",
            "_selected_action": list(ClientAPIKey.objects.values_list("pk", flat=True)),
        },
    )
    assert response.status_code == 302
    for key in (acme[1], other_key):
        assert as_client(key).get(URL).status_code == 401


def test_the_librarys_unrelated_api_key_admin_is_gone(admin_client):
    assert admin_client.get("/admin/rest_framework_api_key/apikey/").status_code == 404
    assert admin_client.get("/admin/clients/clientapikey/").status_code == 200


def test_the_client_admin_sets_the_critical_permission(admin_client, acme):
    client = acme[0]
    response = admin_client.post(
        f"/admin/clients/client/{client.pk}/change/",
        {"name": client.name, "may_send_critical": "on", "webhook_url": ""},
    )
    assert response.status_code == 302, response.content[:500]
    client.refresh_from_db()
    assert client.may_send_critical is True
