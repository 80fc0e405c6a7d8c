"""Operators in the admin: webhook events read-only with redelivery, client secret rotation."""

from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.contrib.messages import get_messages
from django.utils import timezone

from clients.models import Client
from tests.support.factories import ClientFactory
from tests.support.operator_helpers import changelist_page, events_insert_bulk
from tests.support.webhook_factories import WebhookEventFactory
from webhooks.models import DeliveryState, WebhookEvent

pytestmark = pytest.mark.django_db

EVENTS = "/admin/webhooks/webhookevent/"
CLIENTS = "/admin/clients/client/"


def messages_of(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_redeliver_selected_requeues_finished_events_and_reports_counts(superuser):
    failed = WebhookEventFactory(state=DeliveryState.FAILED, delivery_attempts=10)
    delivered = WebhookEventFactory(state=DeliveryState.DELIVERED, delivery_attempts=1)
    pending = WebhookEventFactory()

    response = superuser.post(
        EVENTS,
        {
            "action": "redeliver_selected",
            "_selected_action": [failed.id, delivered.id, pending.id],
        },
        follow=True,
    )

    assert response.status_code == 200
    assert messages_of(response) == [
        "2 event(s) queued for redelivery; 1 skipped (still pending or being delivered)."
    ]
    assert set(
        WebhookEvent.objects.filter(state=DeliveryState.PENDING, delivery_attempts=0).values_list(
            "id", flat=True
        )
    ) == {failed.id, delivered.id, pending.id}
    logged = LogEntry.objects.values_list("object_id", flat=True)
    assert set(logged) == {str(failed.id), str(delivered.id)}


def test_redeliver_needs_its_own_permission(client):
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_webhookevent"))
    client.force_login(viewer)
    event = WebhookEventFactory(state=DeliveryState.FAILED)

    response = client.get(EVENTS)
    assert response.status_code == 200
    assert b"redeliver_selected" not in response.content

    client.post(EVENTS, {"action": "redeliver_selected", "_selected_action": [event.id]})
    event.refresh_from_db()
    assert event.state == DeliveryState.FAILED

    viewer.user_permissions.add(Permission.objects.get(codename="redeliver_webhookevent"))
    assert b"redeliver_selected" in client.get(EVENTS).content
    client.post(EVENTS, {"action": "redeliver_selected", "_selected_action": [event.id]})
    event.refresh_from_db()
    assert event.state == DeliveryState.PENDING


def test_events_can_be_found_by_notification_id_and_filtered_by_state(superuser):
    wanted = WebhookEventFactory(state=DeliveryState.FAILED)
    WebhookEventFactory()

    found = superuser.get(EVENTS, {"q": str(wanted.notification_id)})
    assert [e.id for e in found.context["cl"].result_list] == [wanted.id]
    assert superuser.get(EVENTS, {"q": "not-a-uuid"}).status_code == 200
    failed = superuser.get(EVENTS, {"state__exact": "FAILED"})
    assert [e.id for e in failed.context["cl"].result_list] == [wanted.id]


def test_event_page_is_read_only_and_shows_its_attempts(superuser):
    event = WebhookEventFactory()
    page = superuser.get(f"{EVENTS}{event.id}/change/")
    assert page.status_code == 200
    assert b'name="state"' not in page.content
    assert b"Webhook delivery attempts" in page.content
    superuser.post(f"{EVENTS}{event.id}/change/", {"state": "DELIVERED"})
    event.refresh_from_db()
    assert event.state == DeliveryState.PENDING


def test_rotate_webhook_secret_keeps_the_old_secret_for_24_hours(superuser):
    client = ClientFactory()
    old = client.webhook_secret

    response = superuser.post(
        CLIENTS,
        {"action": "rotate_webhook_secret_selected", "_selected_action": [client.id]},
        follow=True,
    )

    assert "Rotated the webhook secret of 1 client(s)" in messages_of(response)[0]
    client.refresh_from_db()
    assert client.webhook_secret != old and client.webhook_secret.startswith("whsec_")
    assert client.previous_webhook_secret == old
    expected = timezone.now() + timedelta(hours=24)
    assert abs(client.previous_webhook_secret_expires_at - expected) < timedelta(minutes=1)


@pytest.mark.parametrize(
    "url", ["ftp://hooks.example.com/x", "http://10.0.0.7/hook", "http://localhost:8000/hook"]
)
def test_client_form_refuses_unsafe_webhook_urls(superuser, settings, url):
    settings.NOTIFYQUEUE_WEBHOOK_ALLOW_PRIVATE = False
    client = ClientFactory()

    response = superuser.post(
        f"{CLIENTS}{client.id}/change/", {"name": client.name, "webhook_url": url}
    )

    assert response.status_code == 200
    assert "webhook_url" in response.context["adminform"].form.errors
    assert Client.objects.get(id=client.id).webhook_url == ""


def test_client_form_saves_a_public_https_url(superuser):
    client = ClientFactory()
    url = "https://hooks.example.com/notify"
    response = superuser.post(
        f"{CLIENTS}{client.id}/change/", {"name": client.name, "webhook_url": url}
    )
    assert response.status_code == 302
    assert Client.objects.get(id=client.id).webhook_url == url


@pytest.mark.parametrize(
    "query",
    [
        {},
        {"p": "5"},
        {"state__exact": "FAILED"},
        {"client__id__exact": None},
        {"status__exact": "SENT"},
    ],
    ids=["newest", "a later page", "given up", "one client", "one status"],
)
def test_the_event_list_reads_a_page_not_the_history(superuser, query):
    # One event per final notification of a client with a webhook: as many as notifications.
    # Each page reads an index in the list's order; nothing counts, sorts or scans them all.
    busy, other = ClientFactory(), ClientFactory()
    events_insert_bulk(busy.id, 20_000)
    events_insert_bulk(other.id, 100)
    if "client__id__exact" in query:
        query = {"client__id__exact": str(other.id)}

    page, plan = changelist_page(superuser, EVENTS, query, "webhook_event")

    assert len(page) == 100
    created = [event.created_at for event in page]
    assert created == sorted(created, reverse=True)
    assert "Sort Key: webhook_event" not in plan, plan
