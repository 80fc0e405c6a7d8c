"""Every create request is authenticated once and calls the create service at most once,
whichever way it goes: the WSGI shortcut (notifyqueue/serving/shortcuts.py), the URL's view under
Django's handler, the thin path (notifications/ingest.py) or the DRF view it gives a request
back to. The service, the two ways into authentication (`ApiKeyAuthentication` for the DRF
view, the thin path's `_Caller`), the key's lookup and the template renderer are counted in
this process around real requests on real PostgreSQL."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from django.core.handlers.wsgi import WSGIHandler
from werkzeug.test import Client

from clients import authentication, repositories
from clients.models import ClientAPIKey
from notifications import ingest, services
from notifications.views import api_shortcuts
from notifyqueue.serving.shortcuts import ShortcutApplication
from preferences.routing import NotificationContent
from tests.integration.test_api_thin_path import BATCH_URL, URL, VALID

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def calls(monkeypatch) -> Counter:
    """Counts, by name, each call of what a create request must do at most once."""
    counted: Counter = Counter()

    def counting(name, function):
        def call(*args, **kwargs):
            counted[name] += 1
            return function(*args, **kwargs)

        return call

    for name in ("notification_create", "notification_batch_create"):
        monkeypatch.setattr(services, name, counting("service", getattr(services, name)))
    monkeypatch.setattr(
        authentication.ApiKeyAuthentication,
        "authenticate",
        counting("authentication", authentication.ApiKeyAuthentication.authenticate),
    )

    class CountedCaller(ingest._Caller):
        __slots__ = ()

        def __init__(self, *args, **kwargs) -> None:
            counted["authentication"] += 1
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(ingest, "_Caller", CountedCaller)
    monkeypatch.setattr(
        repositories, "api_key_row", counting("key lookup", repositories.api_key_row)
    )
    monkeypatch.setattr(
        NotificationContent, "render", counting("render", NotificationContent.render)
    )
    return counted


@pytest.fixture(params=["shortcut", "django handler"])
def post(request, acme):
    """POSTs JSON as `acme` through the WSGI shortcut, or through Django's handler alone."""
    app = WSGIHandler()
    http = Client(ShortcutApplication(app, api_shortcuts()) if request.param == "shortcut" else app)

    def send(url, body, *, key="", api_key=acme[1], headers=None):
        sent = {"Content-Type": "application/json", "Authorization": f"Api-Key {api_key}"}
        if key:
            sent["Idempotency-Key"] = key
        sent.update(headers or {})
        return http.post(url, data=json.dumps(body).encode(), headers=sent)

    return send


def once(post, calls, *args, **kwargs):
    """The answer to one request, and what it called."""
    calls.clear()
    answer = post(*args, **kwargs)
    return answer.status_code, dict(calls)


def test_a_create_with_a_key_the_process_knows_calls_each_once(post, calls):
    assert post(URL, VALID, key="warm-up").status_code == 201  # the key remembered
    assert once(post, calls, URL, VALID, key="k-1") == (201, {"service": 1, "authentication": 1})


def test_a_create_with_a_key_looked_up_calls_each_once(post, calls):
    authentication._REMEMBERED.clear()
    assert once(post, calls, URL, VALID, key="k-1") == (
        201,
        {"service": 1, "authentication": 1, "key lookup": 1},
    )


def test_a_replayed_idempotency_key_calls_each_once(post, calls):
    assert post(URL, VALID, key="k-1").status_code == 201
    # The checked statement inserts nothing: the key is looked up, then the holder answered.
    assert once(post, calls, URL, VALID, key="k-1") == (
        200,
        {"service": 1, "authentication": 1, "key lookup": 1},
    )


def test_a_batch_calls_each_once(post, calls):
    items = [{**VALID, "idempotency_key": f"b-{n}"} for n in range(3)]
    items.append({**VALID, "idempotency_key": "b-bad", "channel": "fax"})
    assert once(post, calls, BATCH_URL, {"notifications": items}) == (
        200,
        {"service": 1, "authentication": 1, "key lookup": 1},
    )


def test_an_invalid_body_authenticates_once_and_calls_no_service(post, calls):
    assert post(URL, VALID, key="warm-up").status_code == 201
    body = {**VALID, "channel": "fax"}
    assert once(post, calls, URL, body, key="k-1") == (
        400,
        {"authentication": 1, "key lookup": 1},
    )


def test_an_unknown_key_authenticates_once_and_calls_no_service(post, calls):
    assert once(post, calls, URL, VALID, key="k-1", api_key="nope.nope") == (
        401,
        {"authentication": 1, "key lookup": 1},
    )


def test_a_remembered_key_revoked_since_calls_each_once(post, calls, acme):
    assert post(URL, VALID, key="warm-up").status_code == 201
    ClientAPIKey.objects.filter(client=acme[0]).update(revoked=True)
    assert once(post, calls, URL, VALID, key="k-1") == (
        401,
        {"service": 1, "authentication": 1, "key lookup": 1},
    )


def test_a_refused_critical_create_authenticates_once_and_calls_no_service(post, calls):
    body = {**VALID, "priority": "CRITICAL"}
    assert once(post, calls, URL, body, key="k-1") == (
        403,
        {"authentication": 1, "key lookup": 1},
    )


def test_a_request_the_thin_path_gives_back_calls_each_once(post, calls):
    assert post(URL, VALID, key="warm-up").status_code == 201
    accept = {"Accept": "application/json; q=1"}  # the DRF view's to answer
    assert once(post, calls, URL, VALID, key="k-1", headers=accept) == (
        201,
        {"service": 1, "authentication": 1, "key lookup": 1},
    )


def test_a_template_refused_for_a_remembered_key_is_rendered_once(post, calls):
    assert post(URL, VALID, key="warm-up").status_code == 201
    body = {"channel": "email", "recipient": "ada@example.com", "template": "nope", "payload": {}}
    # The template is unknown: the key is looked up before the refusal is answered.
    assert once(post, calls, URL, body, key="k-1") == (
        400,
        {"service": 1, "authentication": 1, "key lookup": 1, "render": 1},
    )
