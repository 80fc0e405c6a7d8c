"""The smtp provider against a hostile client, with a real SMTP server (aiosmtpd) on loopback
started by the test: header breaks beyond CR/LF, addresses the mail package refuses, and the
shared `email:smtp` circuit that another client's mail depends on."""

from __future__ import annotations

import dataclasses
import email
import uuid
from email import policy

import pytest
from aiosmtpd.controller import Controller
from django.db import connection
from rest_framework.test import APIClient

from delivery.circuits.models import CircuitBreaker
from delivery.circuits.services import CircuitPolicy
from delivery.models import DeliveryAttempt
from delivery.providers.base import Message, PermanentFailure
from delivery.providers.smtp import SmtpProvider
from delivery.services import RetryPolicy
from notifications.models import Notification, Status
from ratelimits.services import RateLimit
from tests.integration.test_hostile_input import HEADER_BREAKS
from tests.support.delivery_helpers import simulated_providers, worker_build
from tests.support.factories import NotificationFactory
from tests.support.gunicorn_server import free_port
from tests.support.queue_table import queue_differences

FINAL = {Status.SENT, Status.FAILED, Status.DEAD_LETTERED, Status.CANCELLED, Status.SUPPRESSED}


class Mailbox:
    """What the SMTP server received: each message parsed, with its envelope recipients."""

    def __init__(self) -> None:
        self.messages: list[tuple[list[str], email.message.EmailMessage]] = []

    async def handle_DATA(self, server, session, envelope):
        parsed = email.message_from_bytes(envelope.original_content, policy=policy.default)
        self.messages.append((list(envelope.rcpt_tos), parsed))
        return "250 Message accepted"


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


@pytest.mark.parametrize("char", HEADER_BREAKS, ids=lambda c: f"U+{ord(c):04X}")
def test_a_stored_subject_with_a_header_break_is_a_permanent_content_error(mailbox, char):
    """A row stored before the API refused these (or written by other means) still adds no
    header line: the provider refuses it before building anything."""
    message = Message(uuid.uuid4(), "email", "ada@example.com", f"Hi{char}X-Evil: 1", "b", {})
    assert SmtpProvider(timeout_s=5).send(message) == PermanentFailure("content error: bad header")
    assert mailbox.messages == []


@pytest.mark.parametrize("char", HEADER_BREAKS, ids=lambda c: f"U+{ord(c):04X}")
def test_a_stored_address_with_a_header_break_is_a_permanent_content_error(mailbox, char):
    """Django's address validator takes some control characters in a quoted local part (the
    mail package then ends the To: line at \\x1c); the API refuses them, and the provider
    refuses a row that holds one all the same."""
    recipient = f'"a{char}Bcc:eve@example.com"@example.com'
    message = Message(uuid.uuid4(), "email", recipient, "Hi", "b", {})
    assert SmtpProvider(timeout_s=5).send(message) == PermanentFailure("content error: bad header")
    assert mailbox.messages == []


@pytest.mark.parametrize(
    "recipient",
    ["a@b@c", "<>", "ada@exa mple.com", "(comment@example.com", "a@[1.2.3", "x@y.z>, b@c.d"],
)
def test_an_address_the_mail_package_refuses_is_a_permanent_content_error(mailbox, recipient):
    message = Message(uuid.uuid4(), "email", recipient, "Hi", "b", {})
    result = SmtpProvider(timeout_s=5).send(message)
    assert isinstance(result, PermanentFailure) and result.error.startswith("content error")
    assert mailbox.messages == []


@pytest.mark.django_db(transaction=True)
def test_a_hostile_clients_mail_cannot_open_the_shared_circuit_for_another_client(
    mailbox, make_client
):
    hostile, hostile_key = make_client("hostile")
    _, ordinary_key = make_client("ordinary")
    subjects = [f"Hi{char}X-Evil: 1" for char in ("\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85")]
    subjects += ["Hi\u2028Reply-To : evil@example.com", "Hi\rBcc: all@example.com"]

    # The API refuses each of them, naming the subject...
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Api-Key {hostile_key}")
    for n, subject in enumerate(subjects):
        body = {"channel": "email", "recipient": "ada@example.com", "subject": subject}
        answer = api.post(
            "/api/v1/notifications",
            {**body, "body": "b"},
            format="json",
            HTTP_IDEMPOTENCY_KEY=f"{n}",
        )
        assert answer.status_code == 400 and "subject" in answer.json()["error"]["fields"]
    assert not Notification.objects.exists()
    # ...so the hostile rows are written as an older version stored them; they come first.
    hostile_rows = [
        NotificationFactory(client=hostile, recipient="ada@example.com", subject=s, max_attempts=4)
        for s in subjects
    ]
    api.credentials(HTTP_AUTHORIZATION=f"Api-Key {ordinary_key}")
    ordinary_ids = []
    for n in range(3):
        body = {"channel": "email", "recipient": f"bob{n}@example.com", "subject": "Receipt"}
        answer = api.post(
            "/api/v1/notifications",
            {**body, "body": "Thanks"},
            format="json",
            HTTP_IDEMPOTENCY_KEY=f"o-{n}",
        )
        assert answer.status_code == 201, answer.content
        ordinary_ids.append(answer.json()["id"])

    providers = {**simulated_providers(), "email": SmtpProvider(timeout_s=5)}
    worker = worker_build(
        providers=providers,
        concurrency=2,
        batch_size=4,
        policy=RetryPolicy(base_s=0.01, max_s=0.02),
        circuit=CircuitPolicy(threshold=2, cooldown_s=60, probe_timeout_s=20),
    )
    rate_limit = RateLimit(limit=10, window_s=60)
    worker.config = dataclasses.replace(worker.config, rate_limit=rate_limit)
    worker.run(until_empty=True)

    statuses = dict(Notification.objects.values_list("id", "status"))
    assert {statuses[row.id] for row in hostile_rows} == {Status.FAILED}
    assert {statuses[uuid.UUID(i)] for i in ordinary_ids} == {Status.SENT}
    assert set(
        Notification.objects.filter(client=hostile).values_list("last_error", flat=True)
    ) == {"content error: bad header"}
    circuit = CircuitBreaker.objects.get(name="email:smtp")
    assert (circuit.state, circuit.consecutive_failures) == ("CLOSED", 0)

    # What the server got: the three ordinary mails, once each, under their own keys, and no
    # header of the hostile client's anywhere.
    received = {m["X-Idempotency-Key"]: (to, m) for to, m in mailbox.messages}
    assert len(mailbox.messages) == 3
    assert set(received) == {f"{i}:email" for i in ordinary_ids}
    for to, parsed in received.values():
        assert to[0].startswith("bob") and len(to) == 1
        assert parsed["X-Evil"] is None and parsed["Reply-To"] is None and parsed["Bcc"] is None

    # Universal: every notification final, ended by exactly one attempt; none sent twice;
    # one key per send (above); no recipient over its window's limit; the queue table equals
    # the record.
    assert set(statuses.values()) <= FINAL
    for notification_id, status in statuses.items():
        attempts = list(DeliveryAttempt.objects.filter(notification_id=notification_id))
        assert len(attempts) == 1, (notification_id, [a.outcome for a in attempts])
        assert attempts[0].outcome == ("SENT" if status == Status.SENT else "PERMANENT_FAILURE")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT key, count(*) FROM ratelimit_delivery GROUP BY key HAVING count(*) > %s",
            [rate_limit.limit],
        )
        assert cursor.fetchall() == []
    assert queue_differences() == []
