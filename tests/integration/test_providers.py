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

from delivery.circuits.services import Allowed, Circuit, CircuitPolicy, circuits_register
from delivery.providers.base import Accepted, Message, PermanentFailure, TemporaryFailure
from delivery.providers.http import MESSAGE_ID_MAX_CHARS, HttpProvider
from delivery.providers.simulated import SimulatedProvider
from delivery.providers.smtp import SmtpProvider
from tests.support.http_servers import answer, http_answer


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
    assert result.error == f"http {status}"


def test_http_provider_timeout_is_temporary_and_bounded(scripted):
    server = scripted([(200, {"message_id": "late"})], delay_s=1.5)
    started = time.monotonic()
    result = HttpProvider(url=server.url, timeout_s=0.3).send(message())
    assert result == TemporaryFailure("timeout")
    assert time.monotonic() - started < 1.2


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_http_provider_connection_refused_is_temporary():
    port = free_port()  # nothing listens there
    result = HttpProvider(url=f"http://127.0.0.1:{port}/", timeout_s=1).send(message())
    assert result == TemporaryFailure("connection refused")


def http_send(url: str, *, timeout_s: float = 2.0, allow_private: bool = True):
    return HttpProvider(url=url, timeout_s=timeout_s, allow_private=allow_private).send(message())


@pytest.mark.parametrize(
    "body, expected_id",
    [
        ({"message_id": "m-1"}, "m-1"),
        ({"message_id": "x" * 300}, "x" * 300),
        # A long id is kept up to the documented bound; one in a body over 64 KiB is not read.
        ({"message_id": "y" * 10_000}, "y" * MESSAGE_ID_MAX_CHARS),
        ({"message_id": "y" * 100_000}, None),
        ({"message_id": 42}, "42"),
        ({"message_id": "a\x00b\ud800c\nd"}, "abcd"),
        ({"message_id": None}, None),
        ({"message_id": True}, None),
        ({"message_id": ["m-1"]}, None),
        ({"message_id": {"id": "m-1"}}, None),
        ({"message_id": ""}, None),
        ({"other": "m-1"}, None),
        ("not json at all", None),
        ('["m-1"]', None),
        ('"m-1"', None),
        ("null", None),
        ("", None),
        (b"\xff\xfe\x00garbage\x80", None),
        ("[" * 60_000 + "]" * 60_000, None),
        ('{"message_id": ' + "9" * 5000 + "}", None),
    ],
    ids=lambda v: repr(v)[:40],
)
def test_http_provider_2xx_is_accepted_whatever_the_body_with_a_bounded_id(
    raw_server, body, expected_id
):
    server = raw_server(answer(200, body))
    result = http_send(server.url())
    assert result == Accepted(expected_id)


def test_http_provider_reads_at_most_64_kib_of_a_huge_answer(raw_server):
    # An endless 2xx body: the provider stops reading at its bound and answers at once.
    def endless(conn):
        conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000\r\n\r\n")
        conn.send(b'{"message_id": "' + b"z" * 70_000)
        chunk = b"z" * 65536
        while conn.send(chunk) and not conn.closing.is_set():
            pass

    server = raw_server(endless)
    started = time.monotonic()
    result = http_send(server.url(), timeout_s=5)
    elapsed = time.monotonic() - started

    assert result == Accepted(None)  # the cut body is no JSON
    assert elapsed < 1.0
    server.close()
    # What the server managed to push is what the socket buffers took, not the gigabyte.
    assert server.bytes_sent < 20 * 1024 * 1024


def test_http_provider_provider_dripping_bytes_is_cut_off_at_the_total_deadline(raw_server):
    # One byte every 0.1 s: every single read is quick, only a total deadline ends the call.
    server = raw_server(
        lambda conn: conn.drip(http_answer(200, {"message_id": "slow"}), every_s=0.1)
    )
    started = time.monotonic()
    result = http_send(server.url(), timeout_s=0.5)
    elapsed = time.monotonic() - started

    assert result == TemporaryFailure("timeout")
    assert elapsed < 0.5 + 0.5


def test_http_provider_does_not_follow_a_redirect(raw_server):
    target = raw_server(answer(200, {"message_id": "stolen"}))
    server = raw_server(answer(307, "", {"Location": target.url("/elsewhere")}))

    result = http_send(server.url())

    assert result == TemporaryFailure("redirect 307 not followed")
    assert len(server.requests) == 1
    assert target.requests == []  # the message never reached the redirect's target


def test_http_provider_ignores_proxy_environment_variables(raw_server, monkeypatch):
    proxy = raw_server(answer(200, {"message_id": "from-the-proxy"}))
    server = raw_server(answer(200, {"message_id": "direct"}))
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, proxy.url(""))
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)

    assert http_send(server.url()) == Accepted("direct")
    assert proxy.requests == []


def test_http_provider_checks_the_address_at_call_time(raw_server):
    server = raw_server(answer(200, {"message_id": "m-1"}))

    result = http_send(server.url(), allow_private=False)

    assert result == TemporaryFailure("provider address refused")
    assert server.requests == []


@pytest.mark.parametrize(
    "script, expected",
    [
        (lambda conn: conn.reset(), TemporaryFailure("connection reset")),
        (lambda conn: None, TemporaryFailure("connection closed without an answer")),
        (lambda conn: conn.send(b"HELLO THERE\r\n\r\n"), TemporaryFailure("invalid answer")),
        (lambda conn: conn.send(b"\x00\xff" * 5000), TemporaryFailure("invalid answer")),
        (lambda conn: conn.hang(5), TemporaryFailure("timeout")),
        (answer(302, "", {"Location": "http://169.254.169.254/"}), None),
        (answer(999, "odd"), TemporaryFailure("http 999")),
    ],
    ids=["reset", "closed", "not-http", "binary", "hang", "302", "status-999"],
)
def test_http_provider_ends_every_odd_answer_with_a_short_error(raw_server, script, expected):
    server = raw_server(script)
    started = time.monotonic()
    result = http_send(server.url(), timeout_s=0.5)
    assert time.monotonic() - started < 0.5 + 0.5
    assert result == (expected or TemporaryFailure("redirect 302 not followed"))


@pytest.mark.parametrize("status", [400, 422, 500, 503])
def test_http_provider_never_passes_the_providers_text_on(raw_server, status):
    secret = "internal stack trace: db password hunter2 at 10.0.0.7"
    server = raw_server(answer(status, {"error": secret, "message_id": "m"}))

    result = http_send(server.url())

    assert result.error == f"http {status}"
    assert "hunter2" not in repr(result)


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
def test_simulated_call_whose_key_another_worker_settled_meanwhile_gets_that_answer():
    """The answer is settled once: a key settled between this call's count and its answer
    (another worker's call, here written in `decide`) comes back with the answer it got. The
    key failed temporarily before, so this second call is decided after it is counted."""
    from delivery.models import SimulatedProviderMessage
    from delivery.repositories import DeliveryRepository, SimulatedCall

    DeliveryRepository().simulated_messages_call(
        [("k-raced", "email", "ada@example.com")], lambda calls, recipient: (None, None)
    )

    def decide(calls: int, recipient: str) -> tuple[str | None, str | None]:
        if calls > 1:
            SimulatedProviderMessage.objects.filter(idempotency_key="k-raced").update(
                outcome="ACCEPTED", message_id="other-worker", sends=1
            )
        return "ACCEPTED", "this-worker"

    calls = [("k-raced", "email", "ada@example.com"), ("k-raced", "email", "ada@example.com")]
    answered = DeliveryRepository().simulated_messages_call(calls, decide)

    assert answered == {"k-raced": SimulatedCall(2, "ACCEPTED", "other-worker")}
    record = SimulatedProviderMessage.objects.get(idempotency_key="k-raced")
    assert (record.calls, record.sends, record.message_id) == (2, 1, "other-worker")


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


@pytest.mark.parametrize(
    "subject, recipient, body, error",
    [
        ("Hi\r\nBcc: everyone@example.com", "ada@example.com", "b", "content error: bad header"),
        ("Hi\nthere", "ada@example.com", "b", "content error: bad header"),
        ("Hi", "ada@example.com\r\nBcc: x@example.com", "b", "content error: bad header"),
        ("Hi \ud800", "ada@example.com", "b", "content error: text cannot be encoded"),
        ("Hi", "ada@example.com", "lone \udfff surrogate", "content error: text cannot be encoded"),
        ("Hi", "", "b", "content error: no recipient"),
    ],
    ids=["crlf-subject", "lf-subject", "crlf-recipient", "subject-surrogate", "body", "empty"],
)
def test_smtp_provider_content_errors_are_permanent_and_send_nothing(
    smtp_server, subject, recipient, body, error
):
    handler = smtp_server()
    msg = Message(uuid.uuid4(), "email", recipient, subject, body, {})

    assert SmtpProvider(timeout_s=5).send(msg) == PermanentFailure(error)
    assert handler.messages == []


def test_smtp_provider_errors_carry_the_code_not_the_servers_text(smtp_server):
    smtp_server(refuse="grey", code=451)
    result = SmtpProvider(timeout_s=5).send(message("grey@example.com"))
    assert result == TemporaryFailure("recipient refused: smtp 451")


@pytest.mark.django_db
def test_content_errors_never_open_the_shared_email_circuit(smtp_server):
    # Five CR/LF subjects from one client must not open `email:smtp` for everyone.
    handler = smtp_server()
    provider = SmtpProvider(timeout_s=5)
    circuit = Circuit("email:smtp", CircuitPolicy(threshold=2, cooldown_s=60, probe_timeout_s=20))
    circuits_register([circuit])
    for _ in range(5):
        admission = circuit.admit()
        assert isinstance(admission, Allowed)
        bad = Message(uuid.uuid4(), "email", "ada@example.com", "x\r\nBcc: all", "b", {})
        circuit.record(admission, provider.send(bad))

    admission = circuit.admit()
    assert isinstance(admission, Allowed) and admission.probe_token is None
    assert isinstance(provider.send(message("bob@example.com")), Accepted)
    assert len(handler.messages) == 1


def _provider_by_recipient(conn):
    """A provider whose every odd answer is chosen by the message's recipient."""
    recipient = conn.request.json["recipient"]
    secret = {"error": "stack trace, password hunter2"}
    behaviour = {
        "long-id@example.com": answer(200, {"message_id": "L" * 10_000}),
        "huge-id@example.com": answer(200, {"message_id": "H" * 100_000}),
        "nul-id@example.com": answer(200, '{"message_id": "a\\u0000b\\ud800"}'),
        "garbage@example.com": answer(200, b"\xff\xfe\x00\x80 not json"),
        "array@example.com": answer(200, "[1, 2, 3]"),
        "redirect@example.com": answer(307, "", {"Location": "http://169.254.169.254/"}),
        "rejected@example.com": answer(422, secret),
        "broken@example.com": answer(503, secret),
        "reset@example.com": lambda c: c.reset(),
        "hang@example.com": lambda c: c.hang(3),
        "not-http@example.com": lambda c: c.send(b"SSH-2.0-OpenSSH\r\n\r\n"),
    }.get(recipient, answer(200, {"message_id": "ok"}))
    behaviour(conn)


@pytest.mark.django_db(transaction=True)
def test_worker_ends_every_odd_provider_answer_as_sent_failed_or_dead_lettered(raw_server):
    from delivery.models import DeliveryAttempt
    from delivery.services import RetryPolicy
    from notifications.models import Notification
    from tests.support.delivery_helpers import simulated_providers, worker_build
    from tests.support.factories import ClientFactory, NotificationFactory

    server = raw_server(default=_provider_by_recipient)
    client = ClientFactory()
    expected = {
        "long-id@example.com": ("SENT", "L" * MESSAGE_ID_MAX_CHARS),
        "huge-id@example.com": ("SENT", None),
        "nul-id@example.com": ("SENT", "ab"),
        "garbage@example.com": ("SENT", None),
        "array@example.com": ("SENT", None),
        "plain@example.com": ("SENT", "ok"),
        "rejected@example.com": ("FAILED", None),
        "redirect@example.com": ("DEAD_LETTERED", None),
        "broken@example.com": ("DEAD_LETTERED", None),
        "reset@example.com": ("DEAD_LETTERED", None),
        "hang@example.com": ("DEAD_LETTERED", None),
        "not-http@example.com": ("DEAD_LETTERED", None),
    }
    for recipient in expected:
        NotificationFactory(client=client, recipient=recipient, max_attempts=2)
    providers = {**simulated_providers(), "email": HttpProvider(url=server.url(), timeout_s=0.5)}

    deadline = time.monotonic() + 30
    while Notification.objects.filter(status__in=["PENDING", "PROCESSING"]).exists():
        assert time.monotonic() < deadline, "a notification never reached a final state"
        worker = worker_build(
            providers=providers, concurrency=4, policy=RetryPolicy(base_s=0.01, max_s=0.02)
        )
        worker.run(until_empty=True)

    errors = set()
    for notification in Notification.objects.all():
        status, message_id = expected[notification.recipient]
        attempts = list(DeliveryAttempt.objects.filter(notification=notification))
        assert notification.status == status, notification.recipient
        if status == "SENT":
            assert [a.provider_message_id for a in attempts] == [message_id]
        errors |= {a.error for a in attempts if a.error} | {notification.last_error}
    assert errors - {None} == {
        "http 422",
        "http 503",
        "redirect 307 not followed",
        "connection reset",
        "timeout",
        "invalid answer",
    }


def test_smtp_provider_server_dripping_its_replies_is_cut_off_at_the_total_deadline(settings):
    # One byte of a long multi-line greeting every 0.1 s: each read is quick, so only a total
    # deadline ends the call.
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def drip():
        conn, _ = listener.accept()
        with conn:
            for byte in b"220-" + b"slow " * 200:
                if stop.wait(0.1):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return

    threading.Thread(target=drip, daemon=True).start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", listener.getsockname()[1]
    settings.EMAIL_USE_TLS = False
    try:
        started = time.monotonic()
        result = SmtpProvider(timeout_s=0.5).send(message())
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        listener.close()

    assert result == TemporaryFailure("smtp timeout")
    assert elapsed < 0.5 + 0.5
