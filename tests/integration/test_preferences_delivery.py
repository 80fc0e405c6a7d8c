"""Preferences at send time, and fallback across channels, through the real worker on real
PostgreSQL: notifications are created over the API, then delivered by an in-process worker
with the simulated provider (whose PostgreSQL store shows every call it received)."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from delivery.models import DeliveryAttempt, Outcome, SimulatedProviderMessage
from notifications.models import Notification, Status
from preferences.models import InboxMessage
from tests.integration.test_worker import drain
from tests.support.delivery_helpers import FakeClock, worker_build
from webhooks.models import WebhookEvent

pytestmark = pytest.mark.django_db(transaction=True)

PAYLOAD = {"name": "Ada", "order": "A-17"}


@pytest.fixture
def hooked(make_client) -> APIClient:
    """A client with a webhook URL (so final statuses leave webhook events) and templates for
    order_shipped on every channel."""
    _, key = make_client("hooked", webhook_url="https://hooks.example.com/notify")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Api-Key {key}")
    for channel in ("push", "email", "sms", "in_app"):
        response = api.put(
            f"/api/v1/templates/order_shipped/{channel}",
            {"subject": f"[{channel}] {{order}}", "body": f"{channel}: {{order}} for {{name}}"},
            format="json",
        )
        assert response.status_code == 201
    return api


@pytest.fixture
def worker():
    clock = FakeClock()
    built = worker_build()
    built.test_clock = clock
    yield built
    built.stop()
    built._shutdown()


def preferences(api: APIClient, **fields) -> None:
    body = {
        "channels": ["push", "email"],
        "addresses": {"push": "device-token-1", "email": "ada@example.com"},
        **fields,
    }
    response = api.put("/api/v1/users/u-1/preferences", body, format="json")
    assert response.status_code in (200, 201), response.json()


def create(api: APIClient) -> Notification:
    response = api.post(
        "/api/v1/notifications",
        {"user_id": "u-1", "template": "order_shipped", "payload": PAYLOAD},
        format="json",
        HTTP_IDEMPOTENCY_KEY="k-1",
    )
    assert response.status_code == 201, response.json()
    return Notification.objects.get(id=response.json()["id"])


def attempts(api: APIClient, notification: Notification) -> list[tuple]:
    response = api.get(f"/api/v1/notifications/{notification.id}/attempts")
    assert response.status_code == 200
    return [(a["number"], a["channel"], a["outcome"]) for a in response.json()]


def provider_keys() -> set[str]:
    return set(SimulatedProviderMessage.objects.values_list("idempotency_key", flat=True))


def test_opt_out_while_queued_suppresses_it_and_nothing_is_sent(hooked, worker):
    preferences(hooked)
    notification = create(hooked)
    preferences(hooked, disabled_channels=["push", "email"])

    drain(worker, worker.test_clock)

    notification.refresh_from_db()
    assert notification.status == Status.SUPPRESSED
    assert notification.attempt_count == 0  # claimed, never tried
    assert notification.updated_at == worker.test_clock.now
    assert "no longer allowed" in notification.last_error
    assert provider_keys() == set()  # the provider never saw it, on any channel
    assert attempts(hooked, notification) == [(1, "push", Outcome.SUPPRESSED)]
    event = WebhookEvent.objects.get(notification=notification)
    assert (event.status, event.occurred_at) == (Status.SUPPRESSED, notification.updated_at)


def test_muting_the_event_while_queued_suppresses_it(hooked, worker):
    preferences(hooked)
    notification = create(hooked)
    preferences(hooked, muted_events=["order_shipped"])
    drain(worker, worker.test_clock)
    notification.refresh_from_db()
    assert notification.status == Status.SUPPRESSED
    assert provider_keys() == set()


def test_channel_disabled_while_queued_is_sent_on_the_fallback(hooked, worker):
    preferences(hooked)
    notification = create(hooked)
    assert (notification.channel, notification.fallback_channels) == ("push", ["email"])
    preferences(hooked, disabled_channels=["push"])

    drain(worker, worker.test_clock)

    notification.refresh_from_db()
    assert (notification.status, notification.channel) == (Status.SENT, "email")
    assert (notification.recipient, notification.subject, notification.body) == (
        "ada@example.com",
        "[email] A-17",
        "email: A-17 for Ada",
    )
    assert (notification.attempt_count, notification.fallback_channels) == (1, [])
    assert provider_keys() == {f"{notification.id}:email"}  # never sent on push
    assert attempts(hooked, notification) == [
        (1, "push", Outcome.REROUTED),
        (1, "email", Outcome.SENT),
    ]


def test_an_address_changed_while_queued_is_used(hooked, worker):
    preferences(hooked, channels=["email"])
    notification = create(hooked)
    preferences(hooked, channels=["email"], addresses={"email": "ada@new.example.com"})
    drain(worker, worker.test_clock)
    notification.refresh_from_db()
    assert (notification.status, notification.recipient) == (Status.SENT, "ada@new.example.com")
    assert SimulatedProviderMessage.objects.get().recipient == "ada@new.example.com"


def test_push_failing_forever_falls_back_to_email_after_pushs_attempts(hooked, worker, settings):
    settings.NOTIFYQUEUE_MAX_ATTEMPTS = 3
    preferences(hooked, addresses={"push": "temporary-failure-token", "email": "ada@x.com"})
    notification = create(hooked)

    drain(worker, worker.test_clock)

    notification.refresh_from_db()
    assert (notification.status, notification.channel, notification.attempt_count) == (
        Status.SENT,
        "email",
        1,
    )
    assert attempts(hooked, notification) == [
        (1, "push", Outcome.TEMPORARY_FAILURE),
        (2, "push", Outcome.TEMPORARY_FAILURE),
        (3, "push", Outcome.TEMPORARY_FAILURE),
        (1, "email", Outcome.SENT),
    ]
    push = SimulatedProviderMessage.objects.get(idempotency_key=f"{notification.id}:push")
    assert (push.calls, push.sends) == (3, 0)
    email = SimulatedProviderMessage.objects.get(idempotency_key=f"{notification.id}:email")
    assert (email.calls, email.sends, email.recipient) == (1, 1, "ada@x.com")
    statuses = list(WebhookEvent.objects.values_list("status", flat=True))
    assert statuses == [Status.SENT]  # the switch itself is not a final status


def test_a_user_with_only_push_is_dead_lettered_when_push_keeps_failing(hooked, worker, settings):
    settings.NOTIFYQUEUE_MAX_ATTEMPTS = 3
    preferences(hooked, channels=["push"], addresses={"push": "temporary-failure-token"})
    notification = create(hooked)

    drain(worker, worker.test_clock)

    notification.refresh_from_db()
    assert (notification.status, notification.channel, notification.attempt_count) == (
        Status.DEAD_LETTERED,
        "push",
        3,
    )
    assert [a[2] for a in attempts(hooked, notification)] == [Outcome.TEMPORARY_FAILURE] * 3
    assert WebhookEvent.objects.get().status == Status.DEAD_LETTERED


def test_a_permanent_rejection_moves_to_the_fallback_and_in_app_lands_in_the_inbox(hooked, worker):
    preferences(hooked, channels=["push", "in_app"], addresses={"push": "permanent-failure-token"})
    notification = create(hooked)

    drain(worker, worker.test_clock)

    notification.refresh_from_db()
    assert (notification.status, notification.channel, notification.recipient) == (
        Status.SENT,
        "in_app",
        "u-1",
    )
    assert attempts(hooked, notification) == [
        (1, "push", Outcome.PERMANENT_FAILURE),
        (1, "in_app", Outcome.SENT),
    ]
    inbox = InboxMessage.objects.get(notification=notification)
    assert (inbox.user_id, inbox.subject, inbox.body) == (
        "u-1",
        "[in_app] A-17",
        "in_app: A-17 for Ada",
    )


def test_a_fallback_the_user_disabled_meanwhile_is_skipped(hooked, worker, settings):
    settings.NOTIFYQUEUE_MAX_ATTEMPTS = 1
    preferences(
        hooked,
        channels=["push", "email", "sms"],
        addresses={"push": "temporary-failure-token", "email": "a@x.com", "sms": "+447700900123"},
    )
    notification = create(hooked)
    assert notification.fallback_channels == ["email", "sms"]
    preferences(
        hooked,
        channels=["push", "email", "sms"],
        addresses={"push": "temporary-failure-token", "email": "a@x.com", "sms": "+447700900123"},
        disabled_channels=["email"],
    )
    drain(worker, worker.test_clock)
    notification.refresh_from_db()
    assert (notification.status, notification.channel, notification.recipient) == (
        Status.SENT,
        "sms",
        "+447700900123",
    )
    assert not DeliveryAttempt.objects.filter(notification=notification, channel="email").exists()


def test_a_fallback_template_swapped_to_expand_past_the_bound_fails_fast_at_send(hooked, worker):
    """The in_app template is replaced after the create by 21,845 slots, each to be filled
    with the payload's 60 KB value (1.3 GB if built): when push is refused and the worker
    renders the fallback on its loop, it is refused from the parts' sizes, in bounded time
    and memory, and the notification fails permanently."""
    import time
    import tracemalloc

    preferences(hooked, channels=["push", "in_app"], addresses={"push": "permanent-failure-token"})
    for channel in ("push", "in_app"):
        answer = hooked.put(
            f"/api/v1/templates/big/{channel}", {"subject": "s", "body": "{a}"}, format="json"
        )
        assert answer.status_code == 201
    created = hooked.post(
        "/api/v1/notifications",
        {"user_id": "u-1", "template": "big", "payload": {"a": "x" * 60_000}},
        format="json",
        HTTP_IDEMPOTENCY_KEY="k-big",
    )
    assert created.status_code == 201, created.json()
    swapped = hooked.put(
        "/api/v1/templates/big/in_app", {"subject": "s", "body": "{a}" * 21_845}, format="json"
    )
    assert swapped.status_code == 200

    tracemalloc.start()
    try:
        started = time.monotonic()
        drain(worker, worker.test_clock)
        elapsed = time.monotonic() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    notification = Notification.objects.get(id=created.json()["id"])
    assert notification.status == Status.FAILED
    assert attempts(hooked, notification) == [(1, "push", Outcome.PERMANENT_FAILURE)]
    assert not InboxMessage.objects.exists()
    assert elapsed < 3.0, elapsed
    assert peak < 32 * 1024 * 1024, peak
