"""Each provider against a real server on loopback (contract section 4)."""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from aiosmtpd.controller import Controller

from delivery.providers.base import Accepted, Message, PermanentFailure, TemporaryFailure
from delivery.providers.http import HttpProvider
from delivery.providers.simulated import SimulatedProvider
from delivery.providers.smtp import SmtpProvider


def message(recipient: str = "ada@example.com", channel: str = "email") -> Message:
    return Message(uuid.uuid4(), channel, recipient, "Subject", "Body", {"order": "A-17"})


class ScriptedServer:
    """Answers each POST with the next (status, body) from `script`; records what it got."""

    def __init__(self, script: list[tuple[int, dict | str]], delay_s: float = 0.0):
        self.script = list(script)
        self.delay_s = delay_s
        self.requests: list[tuple[dict, dict]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append((dict(self.headers), body))
                time.sleep(server.delay_s)
                status, answer = server.script.pop(0)
                data = (answer if isinstance(answer, str) else json.dumps(answer)).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/messages"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def scripted():
    servers = []

    def start(script, delay_s=0.0):
        servers.append(ScriptedServer(script, delay_s))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def test_http_provider_posts_the_contract_body_with_the_idempotency_key(scripted):
    server = scripted([(202, {"message_id": "m-1"})])
    msg = message()
    result = HttpProvider(url=server.url, timeout_s=2).send(msg)
    assert result == Accepted("m-1")
    headers, body = server.requests[0]
    assert headers["Idempotency-Key"] == f"{msg.notification_id}:email"
    assert body == {
        "id": str(msg.notification_id),
        "channel": "email",
        "recipient": "ada@example.com",
        "subject": "Subject",
        "body": "Body",
        "metadata": {"order": "A-17"},
    }


@pytest.mark.parametrize(
    "status, expected",
    [
        (400, PermanentFailure),
        (404, PermanentFailure),
        (422, PermanentFailure),
        (408, TemporaryFailure),
        (429, TemporaryFailure),
        (500, TemporaryFailure),
        (503, TemporaryFailure),
    ],
)
def test_http_provider_maps_status_codes(scripted, status, expected):
    server = scripted([(status, {"error": "nope"})])
    result = HttpProvider(url=server.url, timeout_s=2).send(message())
    assert isinstance(result, expected)
    assert str(status) in result.error


def test_http_provider_2xx_without_message_id_is_temporary(scripted):
    server = scripted([(200, "not json")])
    assert isinstance(HttpProvider(url=server.url, timeout_s=2).send(message()), TemporaryFailure)


def test_http_provider_timeout_is_temporary_and_bounded(scripted):
    server = scripted([(200, {"message_id": "late"})], delay_s=1.5)
    started = time.monotonic()
    result = HttpProvider(url=server.url, timeout_s=0.3).send(message())
    assert isinstance(result, TemporaryFailure)
    assert "timed out" in result.error
    assert time.monotonic() - started < 1.2


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_http_provider_connection_refused_is_temporary():
    port = free_port()  # nothing listens there
    result = HttpProvider(url=f"http://127.0.0.1:{port}/", timeout_s=1).send(message())
    assert isinstance(result, TemporaryFailure)
    assert "unreachable" in result.error


class RecordingHandler:
    def __init__(self, refuse: str | None = None, code: int = 550):
        self.messages = []
        self.refuse = refuse
        self.code = code

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        if self.refuse and self.refuse in address:
            return f"{self.code} no such mailbox"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        self.messages.append(envelope.content.decode())
        return "250 Message accepted"


@pytest.fixture
def smtp_server(settings):
    handlers = []

    def start(**kwargs):
        handler = RecordingHandler(**kwargs)
        controller = Controller(handler, hostname="127.0.0.1", port=free_port())
        controller.start()
        handlers.append((handler, controller))
        settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
        settings.EMAIL_HOST = "127.0.0.1"
        settings.EMAIL_PORT = controller.port
        settings.EMAIL_USE_TLS = False
        return handler

    yield start
    for _, controller in handlers:
        controller.stop()


def test_smtp_provider_sends_through_a_real_smtp_server(smtp_server):
    handler = smtp_server()
    provider = SmtpProvider(timeout_s=5)
    msg = message()
    result = provider.send(msg)
    assert result == Accepted(f"<{msg.notification_id}.email@notifyqueue.local>")
    [raw] = handler.messages
    assert f"Message-ID: <{msg.notification_id}.email@notifyqueue.local>" in raw
    assert "To: ada@example.com" in raw
    assert "Body" in raw


def test_smtp_provider_resend_carries_the_same_message_id(smtp_server):
    handler = smtp_server()
    provider = SmtpProvider(timeout_s=5)
    msg = message()
    provider.send(msg)
    provider.send(msg)
    ids = {line for raw in handler.messages for line in raw.splitlines() if "Message-ID" in line}
    assert len(handler.messages) == 2 and len(ids) == 1


def test_smtp_provider_refused_recipient_is_permanent(smtp_server):
    smtp_server(refuse="nobody")
    result = SmtpProvider(timeout_s=5).send(message("nobody@example.com"))
    assert isinstance(result, PermanentFailure)


def test_smtp_provider_greylisting_4xx_is_temporary(smtp_server):
    smtp_server(refuse="grey", code=451)
    result = SmtpProvider(timeout_s=5).send(message("grey@example.com"))
    assert isinstance(result, TemporaryFailure)


def test_smtp_provider_unreachable_server_is_temporary(settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", 1
    assert isinstance(SmtpProvider(timeout_s=1).send(message()), TemporaryFailure)


@pytest.mark.django_db
def test_simulated_provider_answers_a_known_key_as_before_without_sending_again():
    provider = SimulatedProvider()
    msg = message()
    first = provider.send(msg)
    second = provider.send(msg)
    assert isinstance(first, Accepted) and first == second
    from delivery.models import SimulatedProviderMessage

    record = SimulatedProviderMessage.objects.get(idempotency_key=msg.idempotency_key)
    assert (record.calls, record.sends) == (2, 1)


@pytest.mark.django_db
def test_simulated_provider_failure_rate_fails_temporarily():
    import random

    always = SimulatedProvider(failure_rate=1.0, rng=random.Random(1))
    never = SimulatedProvider(failure_rate=0.0)
    assert isinstance(always.send(message()), TemporaryFailure)
    assert isinstance(never.send(message()), Accepted)


@pytest.mark.django_db
def test_simulated_special_recipients_apply_on_every_channel():
    provider = SimulatedProvider()
    for channel in ("email", "sms", "push"):
        assert isinstance(provider.send(message("permanent-failure-1", channel)), PermanentFailure)
        assert isinstance(provider.send(message("temporary-failure-1", channel)), TemporaryFailure)
