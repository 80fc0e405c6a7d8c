"""Email through Django's email framework (EMAIL_URL selects the backend and server).

The Message-ID is derived from the notification, so a resend after a crash is recognisable
as the same message by the receiving side.

What counts as whose fault (the circuit breaker counts only TemporaryFailure):
- the message itself cannot be sent (CR/LF in the subject or the recipient, text that cannot
  be encoded, an address the backend rejects before talking to the server, no recipient):
  PermanentFailure of that one notification. Sending it again cannot help, and it says
  nothing about the server, so it never opens the shared `email:smtp` circuit;
- the server refuses it with a 5xx: PermanentFailure;
- the server is unreachable, times out, or answers 4xx (greylisting, busy): TemporaryFailure.

Errors are short classes and SMTP codes ("smtp 451", "content error: bad header"): clients
read them in `last_error`, so the server's own text never reaches them.
"""

from __future__ import annotations

import smtplib

from django.conf import settings
from django.core.mail import BadHeaderError, EmailMessage, get_connection

from delivery.providers.base import (
    Accepted,
    Message,
    PermanentFailure,
    ProviderResult,
    TemporaryFailure,
)
from notifyqueue.outbound import failure_class


def _content_error(exc: ValueError) -> PermanentFailure:
    if isinstance(exc, BadHeaderError):
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
        message_id = self.message_id(message)
        email = EmailMessage(
            subject=message.subject,
            body=message.body,
            from_email=settings.DEFAULT_FROM_EMAIL,
            to=[message.recipient],
            headers={"Message-ID": message_id, "X-Idempotency-Key": message.idempotency_key},
            connection=get_connection(timeout=self.timeout_s),
        )
        try:
            # Builds and encodes the whole message before any connection: a content error is
            # the message's, found without a round trip to the server.
            email.message().as_bytes()
        except ValueError as exc:  # BadHeaderError and UnicodeError are ValueErrors
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
