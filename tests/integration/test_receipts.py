"""Delivery receipts, tried as their enemies would: signed provider events on real PostgreSQL
and through the real worker (a loopback HTTP provider that answers known message ids)."""

from __future__ import annotations

import base64
import copy
import json
import threading
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from rest_framework.test import APIClient
from standardwebhooks.webhooks import Webhook

from delivery.providers.http import HttpProvider
from delivery.providers.in_app import InAppProvider
from delivery.receipts.models import ProviderEventSeen, Receipt
from delivery.receipts.repositories import SQL as RECEIPT_SQL
from delivery.receipts.services import receipt_record
from delivery.upkeep import ReceiptUpkeep
from notifications.models import Notification, Status
from suppressions.models import Suppression
from tests.integration.test_worker import drain
from tests.support.delivery_helpers import FakeClock, worker_build
from tests.support.races import run_in_threads
from webhooks.models import WebhookEvent

pytestmark = pytest.mark.django_db(transaction=True)

EMAIL_SECRET = "whsec_" + base64.b64encode(b"e" * 32).decode()
SMS_SECRET = "whsec_" + base64.b64encode(b"s" * 32).decode()


@pytest.fixture(autouse=True)
def secrets(settings):
    providers = copy.deepcopy(settings.NOTIFYQUEUE_PROVIDERS)
    providers["email"]["events_secrets"] = [EMAIL_SECRET]
    providers["sms"]["events_secrets"] = [SMS_SECRET]
    providers["push"]["events_secrets"] = []
    settings.NOTIFYQUEUE_PROVIDERS = providers


def http_for(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Api-Key {key}")
    return client


def signed(
    body: dict | bytes,
    *,
    secret: str = EMAIL_SECRET,
    event_id: str | None = None,
    at: datetime | None = None,
) -> tuple[bytes, dict]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    event_id = event_id or f"evt_{uuid.uuid4().hex}"
    at = at or datetime.now(UTC)
    signature = Webhook(secret).sign(msg_id=event_id, timestamp=at, data=raw)
    headers = {
        "HTTP_WEBHOOK_ID": event_id,
        "HTTP_WEBHOOK_TIMESTAMP": str(int(at.timestamp())),
        "HTTP_WEBHOOK_SIGNATURE": signature,
    }
    return raw, headers


def post_event(body, *, channel: str = "email", **signing):
    raw, headers = signed(body, **signing)
    return APIClient().post(
        f"/api/v1/providers/{channel}/events", raw, content_type="application/json", **headers
    )


def receipt(message_id: str, type: str = "delivered", **fields) -> dict:
    return {"message_id": message_id, "type": type, "timestamp": "2026-12-01T12:00:00Z", **fields}


@pytest.fixture
def provider(loopback):
    return loopback


@pytest.fixture
def sender(provider):
    """A worker whose email and SMS go to the loopback provider, taking receipts on both."""
    http = HttpProvider(url=provider.url, timeout_s=5)
    built = worker_build(
        providers={"email": http, "sms": http, "push": http, "in_app": InAppProvider()},
        receipt_channels=frozenset({"email", "sms"}),
    )
    built.test_clock = FakeClock()
    yield built
    built.stop()
    built._shutdown()


@pytest.fixture
def hooked(make_client):
    client, key = make_client("hooked", webhook_url="https://hooks.example.com/n")
    return client, http_for(key)


def create(api: APIClient, recipient: str = "ada@example.com", channel: str = "email"):
    body = {"channel": channel, "recipient": recipient, "subject": "S", "body": "B"}
    response = api.post(
        "/api/v1/notifications", body, format="json", HTTP_IDEMPOTENCY_KEY=uuid.uuid4().hex
    )
    assert response.status_code == 201, response.json()
    return Notification.objects.get(id=response.json()["id"])


def sent(api, provider, sender, message_id: str, **create_fields) -> Notification:
    notification = create(api, **create_fields)
    provider.sent[f"{notification.id}:{notification.channel}"] = message_id
    drain(sender, sender.test_clock)
    notification.refresh_from_db()
    assert notification.status == Status.SENT
    return notification


def nothing_recorded() -> bool:
    return not Receipt.objects.exists() and not ProviderEventSeen.objects.exists()


# Refused: changes nothing


@pytest.mark.parametrize("channel", ["push", "in_app", "fax"])
def test_a_channel_without_a_secret_answers_404(channel):
    response = post_event(receipt("m-1"), channel=channel)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    assert nothing_recorded()


def test_a_forged_event_is_refused_and_changes_nothing(hooked, provider, sender):
    notification = sent(hooked[1], provider, sender, "msg-forged")
    body = receipt("msg-forged", "bounced", bounce="hard")
    assert post_event(body, secret=SMS_SECRET).status_code == 401  # another channel's secret
    other = "whsec_" + base64.b64encode(b"x" * 32).decode()
    assert post_event(body, secret=other).status_code == 401
    raw, headers = signed(body)
    tampered = raw.replace(b"hard", b"soft")
    response = APIClient().post(
        "/api/v1/providers/email/events", tampered, content_type="application/json", **headers
    )
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_signature"
    unsigned = APIClient().post(
        "/api/v1/providers/email/events", raw, content_type="application/json"
    )
    assert unsigned.status_code == 401
    for bad in ({"HTTP_WEBHOOK_TIMESTAMP": "NaN"}, {"HTTP_WEBHOOK_ID": "é" * 10}):
        response = APIClient().post(
            "/api/v1/providers/email/events",
            raw,
            content_type="application/json",
            **{**headers, **bad},
        )
        assert response.status_code == 401
    notification.refresh_from_db()
    assert notification.receipt is None
    assert nothing_recorded() and not Suppression.objects.exists()


@pytest.mark.parametrize("skew_s", [-301, 301, -86400 * 365])
def test_a_stale_or_future_event_is_refused(skew_s):
    at = datetime.now(UTC) + timedelta(seconds=skew_s)
    response = post_event(receipt("m-1"), at=at)
    assert response.status_code == 401
    assert "clock" in response.json()["error"]["message"]
    assert nothing_recorded()


def test_a_replayed_event_id_is_refused_and_changes_nothing(hooked, provider, sender):
    notification = sent(hooked[1], provider, sender, "msg-replay")
    raw, headers = signed(receipt("msg-replay"))
    first = APIClient().post(
        "/api/v1/providers/email/events", raw, content_type="application/json", **headers
    )
    assert first.json() == {"result": "applied"}
    events = WebhookEvent.objects.filter(notification=notification).count()
    again = APIClient().post(
        "/api/v1/providers/email/events", raw, content_type="application/json", **headers
    )
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "replayed_event"
    assert Receipt.objects.count() == 1
    assert WebhookEvent.objects.filter(notification=notification).count() == events


@pytest.mark.parametrize(
    "body",
    [
        receipt("m" * 1001),
        receipt("m\x00"),
        receipt("m\u2028x"),
        receipt(""),
        receipt("m", "opened"),
        receipt("m", "delivered", bounce="hard"),
        receipt("m", "bounced", bounce="medium"),
        {**receipt("m"), "timestamp": "9999-12-31T23:59:59-01:00"},
        {**receipt("m"), "timestamp": "2026-12-01T12:00:00"},
        {**receipt("m"), "timestamp": float("nan")},
        {**receipt("m"), "extra": 1},
        {"message_id": "m"},
        [receipt("m")],
        b"\xff\xfe not json",
        b"[" * 5000,
    ],
)
def test_a_bad_body_is_a_400_and_changes_nothing(body):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = post_event(raw)
    assert response.status_code == 400, response.content
    assert set(response.json()["error"]) == {"code", "message", "fields"}
    assert nothing_recorded()


def test_a_one_megabyte_body_is_a_413_and_changes_nothing():
    body = {**receipt("m"), "pad": "x" * 1024 * 1024}
    response = post_event(body)
    assert response.status_code == 413
    assert response.json()["error"]["code"]
    assert nothing_recorded()


# Recorded once, applied once


def test_a_delivered_receipt_reaches_the_notification_and_its_webhook(hooked, provider, sender):
    notification = sent(hooked[1], provider, sender, "msg-ok")
    assert post_event(receipt("msg-ok")).json() == {"result": "applied"}
    notification.refresh_from_db()
    assert (notification.status, notification.receipt) == (Status.SENT, "delivered")
    shown = hooked[1].get(f"/api/v1/notifications/{notification.id}").json()
    assert shown["receipt"] == "delivered"
    [listed] = hooked[1].get(f"/api/v1/notifications/{notification.id}/receipts").json()
    assert (listed["type"], listed["message_id"], listed["channel"]) == (
        "delivered",
        "msg-ok",
        "email",
    )
    event = WebhookEvent.objects.get(notification=notification, type="receipt.delivered")
    assert (event.status, event.receipt, event.message_id) == ("SENT", "delivered", "msg-ok")
    assert WebhookEvent.objects.filter(notification=notification, type="status").count() == 1


def test_another_client_cannot_read_the_receipts(hooked, provider, sender, make_client):
    notification = sent(hooked[1], provider, sender, "msg-mine")
    post_event(receipt("msg-mine"))
    stranger = http_for(make_client("stranger")[1])
    assert stranger.get(f"/api/v1/notifications/{notification.id}/receipts").status_code == 404
    operator = http_for(make_client("ops", is_operator=True)[1])
    assert len(operator.get(f"/api/v1/notifications/{notification.id}/receipts").json()) == 1


def test_a_hard_bounce_suppresses_the_address_for_every_client_and_stays(
    hooked, provider, sender, make_client
):
    notification = sent(hooked[1], provider, sender, "msg-bounce", recipient="Ada@Example.com")
    assert post_event(receipt("msg-bounce", "bounced", bounce="hard")).status_code == 200
    assert post_event(receipt("msg-bounce", "delivered")).json() == {"result": "applied"}
    notification.refresh_from_db()
    assert notification.receipt == "bounced"  # a later delivered never overwrites it
    entry = Suppression.objects.get()
    assert (entry.address, entry.client_id, entry.reason) == (
        "ada@example.com",
        None,
        "hard_bounce",
    )

    later = create(http_for(make_client("other")[1]), "ada@EXAMPLE.com")
    drain(sender, sender.test_clock)
    later.refresh_from_db()
    assert (later.status, later.last_error) == (Status.SUPPRESSED, "suppressed: hard_bounce")
    assert f"{later.id}:email" not in {c.key for c in provider.calls}


def test_a_soft_bounce_suppresses_nothing(hooked, provider, sender):
    sent(hooked[1], provider, sender, "msg-soft")
    assert post_event(receipt("msg-soft", "bounced", bounce="soft")).status_code == 200
    assert not Suppression.objects.exists()


def test_a_complaint_and_an_sms_opt_out_suppress_for_that_client_only(
    hooked, provider, sender, make_client
):
    client, api = hooked
    sent(api, provider, sender, "msg-complaint")
    sent(api, provider, sender, "msg-stop", recipient="+447700900123", channel="sms")
    assert post_event(receipt("msg-complaint", "complained")).status_code == 200
    stop = receipt("msg-stop", "opted_out")
    assert post_event(stop, channel="sms", secret=SMS_SECRET).status_code == 200
    scoped = set(Suppression.objects.values_list("channel", "address", "client_id", "reason"))
    assert scoped == {
        ("email", "ada@example.com", client.id, "complaint"),
        ("sms", "+447700900123", client.id, "opted_out"),
    }
    mine = create(api, "ada@example.com")
    theirs = create(http_for(make_client("other")[1]), "ada@example.com")
    drain(sender, sender.test_clock)
    mine.refresh_from_db()
    theirs.refresh_from_db()
    assert (mine.status, theirs.status) == (Status.SUPPRESSED, Status.SENT)


def test_the_same_receipt_twice_and_a_flood_for_one_id_are_recorded_once(hooked, provider, sender):
    notification = sent(hooked[1], provider, sender, "msg-flood")
    answers = [post_event(receipt("msg-flood")).json()["result"] for _ in range(50)]
    assert answers == ["applied"] + ["duplicate"] * 49
    for kind in ("failed", "complained", "opted_out", "failed", "delivered"):
        post_event(receipt("msg-flood", kind))
    assert Receipt.objects.count() == 4
    receipt_events = WebhookEvent.objects.filter(notification=notification).exclude(type="status")
    assert sorted(receipt_events.values_list("type", flat=True)) == [
        "receipt.complained",
        "receipt.delivered",
        "receipt.failed",
        "receipt.opted_out",
    ]
    notification.refresh_from_db()
    assert notification.receipt == "complained"


def test_a_providers_secret_reaches_only_its_own_channels_messages(hooked, provider, sender):
    """An SMS provider naming an email message's id (another channel, perhaps another
    client's) matches nothing: the receipt waits, and the email message is untouched."""
    email = sent(hooked[1], provider, sender, "shared-id")
    stop = receipt("shared-id", "opted_out")
    assert post_event(stop, channel="sms", secret=SMS_SECRET).json() == {"result": "pending"}
    email.refresh_from_db()
    assert email.receipt is None
    assert not Suppression.objects.exists()
    assert Receipt.objects.get().notification_id is None


def test_a_receipt_before_the_workers_finish_is_applied_by_the_finish(hooked, provider):
    """The provider has accepted the message, but the worker has not recorded it yet (the
    provider's answer is held back): the receipt waits, then the finish applies it."""
    notification = create(hooked[1])
    provider.sent[f"{notification.id}:email"] = "msg-early"
    provider.hold = True
    http = HttpProvider(url=provider.url, timeout_s=10)
    worker = worker_build(
        providers={"email": http, "sms": http, "push": http, "in_app": InAppProvider()},
        receipt_channels=frozenset({"email"}),
    )
    try:
        worker.run_once(wait_s=0)
        assert provider.received.wait(10)
        answer = post_event(receipt("msg-early", "bounced", bounce="hard"))
        assert answer.json() == {"result": "pending"}
        provider.release.set()
        drain(worker, FakeClock())
    finally:
        worker.stop()
        worker._shutdown()
    notification.refresh_from_db()
    assert (notification.status, notification.receipt) == (Status.SENT, "bounced")
    assert Receipt.objects.get().notification_id == notification.id
    assert Suppression.objects.get().reason == "hard_bounce"
    assert WebhookEvent.objects.filter(type="receipt.bounced").count() == 1


def test_a_pending_receipt_left_by_a_process_that_died_is_applied_by_the_sweep(hooked, provider):
    notification = create(hooked[1])
    provider.sent[f"{notification.id}:email"] = "msg-swept"
    assert post_event(receipt("msg-swept")).json() == {"result": "pending"}
    # A worker that takes no receipts stands for one that died before its second look.
    http = HttpProvider(url=provider.url, timeout_s=10)
    worker = worker_build(providers={"email": http, "in_app": InAppProvider()})
    try:
        drain(worker, FakeClock())
    finally:
        worker.stop()
        worker._shutdown()
    notification.refresh_from_db()
    assert notification.receipt is None
    assert ReceiptUpkeep(pending_age_s=3600, seen_age_s=600).run_once() == (1, 0)
    notification.refresh_from_db()
    assert notification.receipt == "delivered"
    assert ReceiptUpkeep(pending_age_s=3600, seen_age_s=600).run_once() == (0, 0)


def test_old_pending_receipts_and_event_ids_are_pruned_on_the_database_clock():
    clock = FakeClock()
    assert post_event(receipt("never-sent")).json() == {"result": "pending"}
    upkeep = ReceiptUpkeep(pending_age_s=3600, seen_age_s=600)
    assert upkeep.run_once() == (0, 0)
    clock.advance(601)
    assert upkeep.run_once() == (0, 1)  # the event id, past its use
    assert Receipt.objects.count() == 1
    clock.advance(3600)
    assert upkeep.run_once() == (0, 1)
    assert nothing_recorded()


def test_receipts_racing_the_workers_finish_are_applied_exactly_once(hooked, provider, sender):
    """Each receipt arrives on its own thread while the worker records the sends: whichever
    comes second applies it, and only once."""
    api = hooked[1]
    notifications = [create(api, f"user{n}@example.com") for n in range(12)]
    for n, notification in enumerate(notifications):
        provider.sent[f"{notification.id}:email"] = f"msg-race-{n}"

    def race(i: int, barrier: threading.Barrier):
        barrier.wait()
        if i == 0:
            drain(sender, sender.test_clock)
            return None
        results = []
        for n in range(12):
            results.append(
                receipt_record(
                    channel="email",
                    event_id=f"evt-race-{n}",
                    message_id=f"msg-race-{n}",
                    type="delivered",
                    bounce=None,
                    occurred_at=datetime.now(UTC),
                ).result
            )
        return results

    _, results = run_in_threads(2, race)
    assert set(results) <= {"applied", "pending"}
    ReceiptUpkeep(pending_age_s=3600, seen_age_s=600).run_once()
    for notification in notifications:
        notification.refresh_from_db()
        assert (notification.status, notification.receipt) == (Status.SENT, "delivered")
    assert not Receipt.objects.filter(notification__isnull=True).exists()
    per_notification = WebhookEvent.objects.filter(type="receipt.delivered")
    assert per_notification.count() == 12
    assert per_notification.values("notification_id").distinct().count() == 12


def test_matching_a_receipt_probes_the_indexes_whatever_the_history():
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO delivery_attempt (notification_id, claim_token, number, channel, "
            "worker, started_at, finished_at, outcome, provider_message_id) "
            "SELECT gen_random_uuid(), gen_random_uuid(), 1, 'email', 'w', now(), now(), "
            "'SENT', 'hist-' || g FROM generate_series(1, 20000) AS g"
        )
        cursor.execute(
            "INSERT INTO delivery_receipt (id, channel, message_id, type, occurred_at, "
            "received_at, event_id) SELECT gen_random_uuid(), 'email', 'pend-' || g, "
            "'delivered', now(), now(), 'e' || g FROM generate_series(1, 20000) AS g"
        )
        cursor.execute("ANALYZE delivery_attempt")
        cursor.execute("ANALYZE delivery_receipt")
        cursor.execute(
            "EXPLAIN " + RECEIPT_SQL["receipts_match_messages"],
            {"channels": ["email"] * 3, "message_ids": ["hist-1", "hist-2", "pend-3"]},
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "receipt_pending" in plan, plan
    assert "attempt_by_message_id" in plan, plan
    assert "Seq Scan on delivery_receipt" not in plan, plan
    assert "Seq Scan on delivery_attempt" not in plan, plan


def test_a_message_id_of_the_longest_kept_length_matches_whole(hooked, provider, sender):
    """Ids are matched whole through their digest's index, whatever their length: two ids
    that differ only in their last character are two messages."""
    long_id = "H" * 999 + "1"
    notification = sent(hooked[1], provider, sender, long_id)
    other = sent(hooked[1], provider, sender, "H" * 999 + "2")
    assert post_event(receipt(long_id, "complained")).json() == {"result": "applied"}
    notification.refresh_from_db()
    other.refresh_from_db()
    assert (notification.receipt, other.receipt) == ("complained", None)


def test_metrics_count_receipts_by_type_and_suppressed_sends(hooked, provider, sender):
    from tests.integration.test_metrics import scrape, value

    before = scrape()
    sent(hooked[1], provider, sender, "msg-counted")
    post_event(receipt("msg-counted", "bounced", bounce="hard"))
    post_event(receipt("msg-counted", "bounced", bounce="hard"))  # a duplicate counts nothing
    create(hooked[1])  # to the address the bounce suppressed
    drain(sender, sender.test_clock)
    after = scrape()

    def moved(name: str, **labels) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("notifyqueue_receipts_total", channel="email", type="bounced") == 1
    assert moved("notifyqueue_suppressed_sends_total", channel="email", reason="hard_bounce") == 1
