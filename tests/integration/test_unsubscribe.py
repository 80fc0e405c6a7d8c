"""One-click unsubscribe (RFC 8058), tried as its enemies would: the headers every
non-CRITICAL email carries (through the http provider, and a real SMTP server), and the link's
POST, GET, tampered, guessed, expired, rotated and moved tokens."""

from __future__ import annotations

import time
import uuid
from urllib.parse import urlsplit

import pytest
from aiosmtpd.controller import Controller
from django.core import signing
from django.test import Client
from rest_framework.test import APIClient

from delivery.providers.http import HttpProvider
from delivery.providers.in_app import InAppProvider
from delivery.providers.smtp import SmtpProvider
from delivery.unsubscribe.services import Unsubscribe, unsubscribe_token
from notifications.models import Notification, Status
from preferences.models import UserPreferences
from suppressions.models import Suppression
from tests.integration.test_smtp_hostile import Mailbox
from tests.integration.test_worker import drain
from tests.support.delivery_helpers import FakeClock, worker_build
from tests.support.gunicorn_server import free_port

pytestmark = pytest.mark.django_db(transaction=True)

BASE = "https://notify.example.com"
KEY = "unsubscribe-key-" + "x" * 40
DAY_S = 86400


@pytest.fixture(autouse=True)
def public(settings):
    settings.NOTIFYQUEUE_PUBLIC_URL = BASE
    settings.NOTIFYQUEUE_UNSUBSCRIBE_SECRET = KEY
    settings.NOTIFYQUEUE_UNSUBSCRIBE_SECRET_FALLBACKS = []


def http_for(key: str) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Api-Key {key}")
    return api


@pytest.fixture
def sender(loopback):
    http = HttpProvider(url=loopback.url, timeout_s=5)
    built = worker_build(
        providers={"email": http, "sms": http, "push": http, "in_app": InAppProvider()}
    )
    built.test_clock = FakeClock()
    yield built
    built.stop()
    built._shutdown()


def create(api: APIClient, **fields) -> Notification:
    body = {"channel": "email", "recipient": "ada@example.com", "subject": "S", "body": "B"}
    response = api.post(
        "/api/v1/notifications",
        {**body, **fields},
        format="json",
        HTTP_IDEMPOTENCY_KEY=uuid.uuid4().hex,
    )
    assert response.status_code == 201, response.json()
    return Notification.objects.get(id=response.json()["id"])


def headers_sent(loopback, notification: Notification) -> dict | None:
    [call] = [c for c in loopback.calls if c.key.startswith(str(notification.id))]
    return call.body.get("headers")


def path_of(header: str) -> str:
    assert header.startswith(f"<{BASE}/unsubscribe/") and header.endswith(">"), header
    return urlsplit(header[1:-1]).path


def one_click(path: str):
    # No credentials, and a client that enforces CSRF as a browser's would be held to.
    return Client(enforce_csrf_checks=True).post(
        path, "List-Unsubscribe=One-Click", content_type="application/x-www-form-urlencoded"
    )


def test_every_non_critical_email_carries_the_one_click_headers(make_client, loopback, sender):
    api = http_for(make_client("acme", may_send_critical=True)[1])
    normal, low = create(api), create(api, priority="LOW")
    critical = create(api, priority="CRITICAL")
    sms = create(api, channel="sms", recipient="+447700900123")
    drain(sender, sender.test_clock)
    for email in (normal, low):
        headers = headers_sent(loopback, email)
        assert set(headers) == {"List-Unsubscribe", "List-Unsubscribe-Post"}
        path_of(headers["List-Unsubscribe"])
        assert headers["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    assert headers_sent(loopback, critical) is None
    assert headers_sent(loopback, sms) is None


def test_without_a_public_url_no_email_carries_them(settings, api, loopback, sender):
    settings.NOTIFYQUEUE_PUBLIC_URL = ""
    email = create(api)
    drain(sender, sender.test_clock)
    assert headers_sent(loopback, email) is None


def test_one_click_suppresses_a_direct_address_for_that_client_only(
    acme, api, make_client, loopback, sender
):
    first = create(api, recipient="Ada@Example.com")
    drain(sender, sender.test_clock)
    path = path_of(headers_sent(loopback, first)["List-Unsubscribe"])
    for _ in range(2):  # idempotent
        response = one_click(path)
        assert response.status_code == 200
        assert b"unsubscribed" in response.content
    entry = Suppression.objects.get()
    assert (entry.address, entry.client_id, entry.reason) == (
        "ada@example.com",
        acme[0].id,
        "unsubscribed",
    )
    again = create(api, recipient="ada@example.com")
    other = create(http_for(make_client("other")[1]), recipient="ada@example.com")
    drain(sender, sender.test_clock)
    again.refresh_from_db()
    other.refresh_from_db()
    assert (again.status, again.last_error) == (Status.SUPPRESSED, "suppressed: unsubscribed")
    assert other.status == Status.SENT


def test_one_click_mutes_the_event_for_that_user_and_what_is_queued_is_not_sent(
    api, loopback, sender
):
    api.put("/api/v1/templates/shipped/email", {"subject": "S", "body": "B"}, format="json")
    api.put("/api/v1/templates/digest/email", {"subject": "D", "body": "B"}, format="json")
    api.put(
        "/api/v1/users/u-1/preferences",
        {"channels": ["email"], "addresses": {"email": "ada@example.com"}},
        format="json",
    )

    def by_event(event: str) -> Notification:
        response = api.post(
            "/api/v1/notifications",
            {"user_id": "u-1", "template": event, "payload": {}},
            format="json",
            HTTP_IDEMPOTENCY_KEY=uuid.uuid4().hex,
        )
        return Notification.objects.get(id=response.json()["id"])

    first = by_event("shipped")
    drain(sender, sender.test_clock)
    path = path_of(headers_sent(loopback, first)["List-Unsubscribe"])
    queued, other_event = by_event("shipped"), by_event("digest")
    assert one_click(path).status_code == 200
    assert one_click(path).status_code == 200
    preferences = api.get("/api/v1/users/u-1/preferences").json()
    assert preferences["muted_events"] == ["shipped"]
    drain(sender, sender.test_clock)
    queued.refresh_from_db()
    other_event.refresh_from_db()
    assert queued.status == Status.SUPPRESSED
    assert other_event.status == Status.SENT
    assert not Suppression.objects.exists()


def test_a_get_shows_a_button_and_changes_nothing(acme):
    token = unsubscribe_token(Unsubscribe(acme[0].id, address="ada@example.com"))
    response = Client().get(f"/unsubscribe/{token}")
    assert response.status_code == 200
    assert b'name="List-Unsubscribe" value="One-Click"' in response.content
    assert b'method="post"' in response.content
    assert not Suppression.objects.exists()


def test_a_post_without_the_one_click_body_changes_nothing(acme):
    token = unsubscribe_token(Unsubscribe(acme[0].id, address="ada@example.com"))
    for body in ("", "List-Unsubscribe=Later", "x" * 5000):
        response = Client().post(
            f"/unsubscribe/{token}", body, content_type="application/x-www-form-urlencoded"
        )
        assert response.status_code == 400
    assert not Suppression.objects.exists()


def test_tampered_guessed_and_moved_tokens_change_nothing(acme, api):
    response = api.put(
        "/api/v1/users/u-2/preferences",
        {"channels": ["email"], "addresses": {"email": "bob@example.com"}},
        format="json",
    )
    assert response.status_code == 201
    mine = unsubscribe_token(Unsubscribe(acme[0].id, user_id="u-1", event="shipped"))
    theirs = unsubscribe_token(Unsubscribe(acme[0].id, user_id="u-2", event="shipped"))
    # The payload of one user's token with the signature of another's.
    moved = theirs.split(":", 1)[0] + ":" + mine.split(":", 1)[1]
    flipped = mine[:-3] + ("AAA" if not mine.endswith("AAA") else "BBB")
    forged = signing.dumps(
        {"c": str(acme[0].id), "u": "u-2", "e": "shipped"},
        key="a guess",
        salt="notifyqueue.unsubscribe",
    )
    wrong_salt = signing.dumps({"c": str(acme[0].id), "a": "ada@example.com"}, key=KEY)
    for token in (moved, flipped, forged, wrong_salt, "x", "a" * 4000, "..:..", "%00"):
        assert one_click(f"/unsubscribe/{token}").status_code == 400, token
    assert UserPreferences.objects.get(user_id="u-2").muted_events == []
    assert not Suppression.objects.exists()


def signed_days_ago(target: Unsubscribe, days: float, monkeypatch) -> str:
    """A token as a worker would have signed it `days` ago (its clock then)."""
    real = time.time()
    with monkeypatch.context() as patched:
        patched.setattr(signing.time, "time", lambda: real - days * DAY_S)
        return unsubscribe_token(target)


def test_a_token_works_sixty_days_and_not_after_its_lifetime(acme, monkeypatch, settings):
    target = Unsubscribe(acme[0].id, address="ada@example.com")
    assert one_click(f"/unsubscribe/{signed_days_ago(target, 91, monkeypatch)}").status_code == 400
    assert not Suppression.objects.exists()
    assert one_click(f"/unsubscribe/{signed_days_ago(target, 60, monkeypatch)}").status_code == 200
    assert Suppression.objects.count() == 1
    settings.NOTIFYQUEUE_UNSUBSCRIBE_TOKEN_DAYS = 60
    expired = signed_days_ago(Unsubscribe(acme[0].id, address="bob@example.com"), 61, monkeypatch)
    assert one_click(f"/unsubscribe/{expired}").status_code == 400


def test_a_rotated_key_still_verifies_while_it_is_a_fallback(acme, settings):
    old = unsubscribe_token(Unsubscribe(acme[0].id, address="ada@example.com"))
    settings.NOTIFYQUEUE_UNSUBSCRIBE_SECRET = "the-new-key-" + "y" * 40
    assert one_click(f"/unsubscribe/{old}").status_code == 400
    settings.NOTIFYQUEUE_UNSUBSCRIBE_SECRET_FALLBACKS = [KEY]
    assert one_click(f"/unsubscribe/{old}").status_code == 200
    assert Suppression.objects.count() == 1


@pytest.fixture
def mailbox(settings):
    box = Mailbox()
    controller = Controller(box, hostname="127.0.0.1", port=free_port())
    controller.start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", controller.port
    settings.EMAIL_USE_TLS = False
    yield box
    controller.stop()


def test_the_smtp_provider_writes_the_headers_a_real_server_receives(acme, api, mailbox):
    notification = create(api)
    worker = worker_build(providers={"email": SmtpProvider(timeout_s=5)})
    try:
        drain(worker, FakeClock())
    finally:
        worker.stop()
        worker._shutdown()
    notification.refresh_from_db()
    assert notification.status == Status.SENT
    [(recipients, message)] = mailbox.messages
    assert recipients == ["ada@example.com"]
    assert message["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    # A long header is folded on the wire; unfolded, it is the same URL.
    path = path_of(str(message["List-Unsubscribe"]).strip())
    assert one_click(path).status_code == 200
    assert Suppression.objects.get().client_id == acme[0].id
