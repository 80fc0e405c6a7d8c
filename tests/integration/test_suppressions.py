"""The suppression list: its operator API and its send-time stage, through the real worker on
real PostgreSQL (the simulated provider's store shows every call it received)."""

from __future__ import annotations

import logging
import threading
import uuid

import pytest
from django.db import connection, connections
from rest_framework.test import APIClient

from delivery.models import Outcome, SimulatedProviderMessage
from notifications.models import Notification, Status
from preferences.routing import PreferenceRouter
from suppressions.models import Reason, Suppression
from suppressions.repositories import SQL, AddressCheck, SuppressionRepository
from suppressions.services import suppression_add
from tests.integration.test_worker import drain
from tests.support.delivery_helpers import FakeClock, worker_build
from webhooks.models import WebhookEvent

pytestmark = pytest.mark.django_db(transaction=True)


def http(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Api-Key {key}")
    return client


@pytest.fixture
def operator(make_client) -> APIClient:
    return http(make_client("ops", is_operator=True)[1])


@pytest.fixture
def worker():
    built = worker_build()
    built.test_clock = FakeClock()
    yield built
    built.stop()
    built._shutdown()


def create(api: APIClient, recipient: str, key: str | None = None, **fields) -> Notification:
    body = {"channel": "email", "recipient": recipient, "subject": "Hi", "body": "B", **fields}
    response = api.post(
        "/api/v1/notifications", body, format="json", HTTP_IDEMPOTENCY_KEY=key or uuid.uuid4().hex
    )
    assert response.status_code == 201, response.json()
    return Notification.objects.get(id=response.json()["id"])


def sent_to() -> set[str]:
    return set(SimulatedProviderMessage.objects.values_list("recipient", flat=True))


# The operator API


def test_the_suppression_endpoints_are_for_operators_only(api):
    assert api.get("/api/v1/suppressions").status_code == 403
    response = api.post(
        "/api/v1/suppressions", {"channel": "email", "address": "a@example.com"}, format="json"
    )
    assert response.status_code == 403
    assert api.delete(f"/api/v1/suppressions/{uuid.uuid4()}").status_code == 403
    assert Suppression.objects.count() == 0
    assert APIClient().get("/api/v1/suppressions").status_code == 401


def test_an_operator_adds_an_address_in_its_counting_form_once(operator, acme):
    body = {"channel": "email", "address": "Ada@EXAMPLE.com", "client_id": str(acme[0].id)}
    first = operator.post("/api/v1/suppressions", body, format="json")
    assert first.status_code == 201, first.json()
    entry = first.json()
    assert (entry["address"], entry["client_id"], entry["reason"]) == (
        "ada@example.com",
        str(acme[0].id),
        "operator",
    )
    again = operator.post(
        "/api/v1/suppressions", {**body, "address": "ada@example.COM"}, format="json"
    )
    assert (again.status_code, again.json()["id"]) == (200, entry["id"])
    # Every client is another scope: a second entry.
    every = operator.post("/api/v1/suppressions", {**body, "client_id": None}, format="json")
    assert every.status_code == 201 and every.json()["client_id"] is None
    assert Suppression.objects.count() == 2


@pytest.mark.parametrize(
    "body",
    [
        {"channel": "fax", "address": "a@example.com"},
        {"channel": "email", "address": "not an address"},
        {"channel": "email", "address": "a\x00b@example.com"},
        {"channel": "email", "address": "a@example.com\r\nBcc: b@example.com"},
        {"channel": "sms", "address": "+1" + "9" * 4000},
        {"channel": "email", "address": "a@example.com", "reason": "x"},
        {"channel": "email", "address": "a@example.com", "client_id": "nope"},
        {"channel": "email"},
    ],
)
def test_a_bad_suppression_is_a_400_and_adds_nothing(operator, body):
    response = operator.post("/api/v1/suppressions", body, format="json")
    assert response.status_code == 400, response.content
    assert set(response.json()["error"]) == {"code", "message", "fields"}
    assert Suppression.objects.count() == 0


def test_the_list_pages_newest_first_and_a_removal_is_logged(operator, caplog):
    for n in range(5):
        suppression_add(
            channel="sms",
            recipient=f"+4477009001{n:02d}",
            client_id=None,
            reason=Reason.OPERATOR,
            source="test",
        )
    seen, url = [], "/api/v1/suppressions?page_size=2"
    while url:
        page = operator.get(url).json()
        seen += [e["address"] for e in page["results"]]
        url = page["next"]
    assert seen == [f"+4477009001{n:02d}" for n in reversed(range(5))]
    assert operator.get("/api/v1/suppressions?cursor=garbage").status_code == 400

    target = Suppression.objects.get(address="+447700900103")
    with caplog.at_level(logging.INFO, logger="notifyqueue.suppressions"):
        removed = operator.delete(f"/api/v1/suppressions/{target.id}")
    assert removed.status_code == 200 and removed.json()["address"] == "+447700900103"
    assert any(
        "suppression removed" in r.getMessage() and "operator ops" in r.getMessage()
        for r in caplog.records
    )
    assert not Suppression.objects.filter(id=target.id).exists()
    assert operator.delete(f"/api/v1/suppressions/{target.id}").status_code == 404


# The send-time stage


def test_an_address_suppressed_for_every_client_is_never_sent_by_any(worker, make_client):
    one, two = (http(make_client(name, webhook_url="https://h.example/x")[1]) for name in "ab")
    suppression_add(
        channel="email",
        recipient="ADA@example.com",
        client_id=None,
        reason=Reason.HARD_BOUNCE,
        source="test",
    )
    stopped = [create(one, "ada@Example.com"), create(two, "ada@example.com")]
    kept = create(one, "bob@example.com")
    drain(worker, worker.test_clock)

    for notification in stopped:
        notification.refresh_from_db()
        assert (notification.status, notification.last_error, notification.attempt_count) == (
            Status.SUPPRESSED,
            "suppressed: hard_bounce",
            0,
        )
        assert notification.attempts.get().outcome == Outcome.SUPPRESSED
        assert WebhookEvent.objects.get(notification=notification).status == Status.SUPPRESSED
    kept.refresh_from_db()
    assert kept.status == Status.SENT
    assert sent_to() == {"bob@example.com"}


def test_an_address_suppressed_for_one_client_is_still_sent_by_another(worker, make_client):
    (first, first_key), (_, second_key) = make_client("first"), make_client("second")
    suppression_add(
        channel="email",
        recipient="ada@example.com",
        client_id=first.id,
        reason=Reason.COMPLAINT,
        source="test",
    )
    stopped = create(http(first_key), "ada@example.com")
    sent = create(http(second_key), "ada@example.com")
    drain(worker, worker.test_clock)
    stopped.refresh_from_db()
    sent.refresh_from_db()
    assert (stopped.status, stopped.last_error) == (Status.SUPPRESSED, "suppressed: complaint")
    assert sent.status == Status.SENT


def test_a_suppressed_preference_mode_notification_falls_back_to_the_next_channel(
    worker, make_client
):
    client, key = make_client("pref")
    api = http(key)
    for channel in ("email", "sms"):
        api.put(
            f"/api/v1/templates/shipped/{channel}",
            {"subject": "S", "body": "{order}"},
            format="json",
        )
    api.put(
        "/api/v1/users/u-1/preferences",
        {
            "channels": ["email", "sms"],
            "addresses": {"email": "ada@example.com", "sms": "+447700900123"},
        },
        format="json",
    )
    suppression_add(
        channel="email",
        recipient="ada@example.com",
        client_id=client.id,
        reason=Reason.UNSUBSCRIBED,
        source="test",
    )
    response = api.post(
        "/api/v1/notifications",
        {"user_id": "u-1", "template": "shipped", "payload": {"order": "A-17"}},
        format="json",
        HTTP_IDEMPOTENCY_KEY="k",
    )
    notification = Notification.objects.get(id=response.json()["id"])
    drain(worker, worker.test_clock)
    notification.refresh_from_db()
    assert (notification.status, notification.channel) == (Status.SENT, "sms")
    assert sent_to() == {"+447700900123"}
    outcomes = list(notification.attempts.order_by("started_at").values_list("channel", "outcome"))
    assert outcomes == [("email", Outcome.SUPPRESSED), ("sms", Outcome.SENT)]


class SuppressingWhileClaimed(PreferenceRouter):
    """Adds the suppression from another connection after the claim, before the suppression
    stage: the row is PROCESSING, held by this worker, when the entry commits."""

    def __init__(self, client_id) -> None:
        super().__init__()
        self.client_id = client_id
        self.statuses: list[str] = []

    def routes_at_send(self, claims):
        def other_connection(claim) -> None:
            try:
                self.statuses.append(Notification.objects.get(id=claim.id).status)
                suppression_add(
                    channel="email",
                    recipient=claim.recipient,
                    client_id=self.client_id,
                    reason=Reason.COMPLAINT,
                    source="race",
                )
            finally:
                connections.close_all()

        for claim in claims:
            thread = threading.Thread(target=other_connection, args=(claim,))
            thread.start()
            thread.join()
        return super().routes_at_send(claims)


def test_an_address_suppressed_while_its_notification_is_claimed_is_not_sent(make_client):
    client, key = make_client("claimed")
    api = http(key)
    api.put("/api/v1/templates/t/email", {"subject": "S", "body": "B"}, format="json")
    api.put(
        "/api/v1/users/u-1/preferences",
        {"channels": ["email"], "addresses": {"email": "ada@example.com"}},
        format="json",
    )
    response = api.post(
        "/api/v1/notifications",
        {"user_id": "u-1", "template": "t", "payload": {}},
        format="json",
        HTTP_IDEMPOTENCY_KEY="k",
    )
    router = SuppressingWhileClaimed(client.id)
    built = worker_build(router=router)
    try:
        drain(built, FakeClock())
    finally:
        built.stop()
        built._shutdown()
    notification = Notification.objects.get(id=response.json()["id"])
    assert router.statuses == [Status.PROCESSING]
    assert (notification.status, notification.last_error) == (
        Status.SUPPRESSED,
        "suppressed: complaint",
    )
    assert sent_to() == set()


def test_the_send_time_look_up_probes_the_index_whatever_the_lists_length(acme):
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO suppression (id, channel, address, address_digest, client_id, reason, "
            "source, created_at) SELECT gen_random_uuid(), 'email', 'u' || g || '@example.com', "
            "md5('u' || g || '@example.com')::uuid, NULL, 'hard_bounce', '', now() "
            "FROM generate_series(1, 20000) AS g"
        )
        cursor.execute("ANALYZE suppression")
    checks = [
        AddressCheck(uuid.uuid4(), acme[0].id, "email", f"u{n}@example.com") for n in range(1, 11)
    ]
    found = SuppressionRepository().matches(checks)
    assert set(found.values()) == {"hard_bounce"} and len(found) == 10
    with connection.cursor() as cursor:
        cursor.execute(
            "EXPLAIN " + SQL["suppression_matches"],
            {
                "ids": [c.id for c in checks],
                "client_ids": [c.client_id for c in checks],
                "channels": [c.channel for c in checks],
                "addresses": [c.address for c in checks],
            },
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "suppression_address_scope" in plan, plan
    assert "Seq Scan on suppression" not in plan, plan
