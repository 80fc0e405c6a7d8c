"""Email through Django's email framework (EMAIL_URL selects the backend and server).

The Message-ID is derived from the notification, so a resend after a crash is recognisable
as the same message by the receiving side.

What counts as whose fault (the circuit breaker counts only TemporaryFailure):
- the message itself cannot be sent (a control character or line separator in the subject
  or the recipient, text that cannot be encoded, an address the backend rejects before
  talking to the server, no recipient, or any other exception while the message is built):
  PermanentFailure of that one notification. Sending it again cannot help, and it says
  nothing about the server, so it never opens the shared `email:smtp` circuit;
- the server refuses it with a 5xx: PermanentFailure;
- the server is unreachable, times out, or answers 4xx (greylisting, busy): TemporaryFailure.

Errors are short classes and SMTP codes ("smtp 451", "content error: bad header"): clients
read them in `last_error`, so the server's own text never reaches them.

With Django's SMTP backend, one call has one total deadline, NOTIFYQUEUE_PROVIDER_TIMEOUT_SECONDS
from the greeting to the last reply (a server dripping its replies is cut off, as the http
provider's is); the TCP connect itself, and an SMTPS handshake, are bounded by the same
timeout as a socket timeout.
"""

from __future__ import annotations

import functools
import smtplib
from email.errors import HeaderParseError

from django.conf import settings
from django.core.mail import BadHeaderError, EmailMessage, get_connection
from django.core.mail.backends.smtp import EmailBackend as SMTPEmailBackend
from django.core.mail.message import sanitize_address
from django.utils.module_loading import import_string

from delivery.providers.base import (
    Accepted,
    Message,
    PermanentFailure,
    ProviderResult,
    TemporaryFailure,
)
from notifyqueue.outbound import SocketDeadline, failure_class
from notifyqueue.vocabulary import HEADER_BREAKS


class _WatchedSocket:
    """Puts the SMTP connection's socket under a SocketDeadline as soon as it exists."""

    def __init__(self, *args, deadline: SocketDeadline, **kwargs):
        self._deadline = deadline  # before super().__init__, which connects
        super().__init__(*args, **kwargs)

    def _get_socket(self, host, port, timeout):
        sock = super()._get_socket(host, port, timeout)
        # STARTTLS replaces self.sock with the wrapped socket; watch whichever is live.
        self._deadline.watch(lambda: getattr(self, "sock", None) or sock)
        return sock


class _WatchedSMTP(_WatchedSocket, smtplib.SMTP):
    pass


class _WatchedSMTPSSL(_WatchedSocket, smtplib.SMTP_SSL):
    pass


class _DeadlineEmailBackend(SMTPEmailBackend):
    """Django's SMTP backend, with every connection it opens watched by `deadline`."""

    def __init__(self, *, deadline: SocketDeadline, **kwargs):
        super().__init__(**kwargs)
        self.deadline = deadline

    @property
    def connection_class(self):
        cls = _WatchedSMTPSSL if self.use_ssl else _WatchedSMTP
        return functools.partial(cls, deadline=self.deadline)


def _content_error(exc: Exception) -> PermanentFailure:
    if isinstance(exc, BadHeaderError | HeaderParseError):
        kind = "bad header"
    elif isinstance(exc, UnicodeError):
        kind = "text cannot be encoded"
    else:
        kind = "invalid message"
    return PermanentFailure(f"content error: {kind}")


class SmtpProvider:
    name = "smtp"

    def __init__(self, *, timeout_s: float, domain: str = "notifyqueue.local") -> None:
        self.timeout_s = timeout_s
        self.domain = domain

    def message_id(self, message: Message) -> str:
        return f"<{message.notification_id}.{message.channel}@{self.domain}>"

    def send(self, message: Message) -> ProviderResult:
        with SocketDeadline(self.timeout_s) as deadline:
            result = self._send(message, deadline)
        if deadline.expired and isinstance(result, TemporaryFailure):
            return TemporaryFailure("smtp timeout")
        return result

    def _connection(self, deadline: SocketDeadline):
        if import_string(settings.EMAIL_BACKEND) is SMTPEmailBackend:
            return _DeadlineEmailBackend(deadline=deadline, timeout=self.timeout_s)
        # Console, locmem, file or a custom backend: as configured.
        return get_connection(timeout=self.timeout_s)

    def _send(self, message: Message, deadline: SocketDeadline) -> ProviderResult:
        message_id = self.message_id(message)
        connection = self._connection(deadline)
        if HEADER_BREAKS.search(message.subject) or HEADER_BREAKS.search(message.recipient):
            # The API refuses these; a row stored before it did must not add header lines.
            return PermanentFailure("content error: bad header")
        try:
            email = EmailMessage(
                subject=message.subject,
                body=message.body,
                from_email=settings.DEFAULT_FROM_EMAIL,
                to=[message.recipient],
                headers={
                    **message.headers,
                    "Message-ID": message_id,
                    "X-Idempotency-Key": message.idempotency_key,
                },
                connection=connection,
            )
            # Builds and encodes the whole message, and the addresses as the backend will,
            # before any connection: a content error is the message's, found without a round
            # trip to the server. Whatever the mail package raises here (ValueError,
            # HeaderParseError, ...) is about this message, never about the server.
            email.message().as_bytes()
            for address in (email.from_email, *email.recipients()):
                sanitize_address(address, email.encoding or settings.DEFAULT_CHARSET)
        except Exception as exc:
            return _content_error(exc)
        try:
            sent = email.send(fail_silently=False)
        except smtplib.SMTPRecipientsRefused as exc:
            # 4xx (greylisting, mailbox busy) may pass later; 5xx will not.
            codes = sorted({code for code, _ in exc.recipients.values()})
            detail = "recipient refused: smtp " + ", ".join(str(c) for c in codes)
            return (
                TemporaryFailure(detail)
                if all(c < 500 for c in codes)
                else PermanentFailure(detail)
            )
        except smtplib.SMTPResponseException as exc:
            detail = f"smtp {exc.smtp_code}"
            return PermanentFailure(detail) if exc.smtp_code >= 500 else TemporaryFailure(detail)
        except (TimeoutError, smtplib.SMTPException, OSError) as exc:
            return TemporaryFailure(f"smtp {failure_class(exc)}")
        except ValueError as exc:
            # The backend's own address checks (sanitize_address) run only when it sends.
            return _content_error(exc)
        if not sent:
            return PermanentFailure("content error: no recipient")
        return Accepted(message_id)
