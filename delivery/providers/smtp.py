"""Email through Django's email framework (EMAIL_URL selects the backend and server).

The Message-ID is derived from the notification, so a resend after a crash is recognisable
as the same message by the receiving side.
"""

from __future__ import annotations

import smtplib

from django.conf import settings
from django.core.mail import EmailMessage, get_connection

from delivery.providers.base import (
    Accepted,
    Message,
    PermanentFailure,
    ProviderResult,
    TemporaryFailure,
)


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
            email.send(fail_silently=False)
        except smtplib.SMTPRecipientsRefused as exc:
            detail = f"recipient refused: {exc.recipients}"
            # 4xx (greylisting, mailbox busy) may pass later; 5xx will not.
            codes = [code for code, _ in exc.recipients.values()]
            return (
                TemporaryFailure(detail)
                if all(c < 500 for c in codes)
                else PermanentFailure(detail)
            )
        except smtplib.SMTPResponseException as exc:
            detail = f"SMTP {exc.smtp_code}: {exc.smtp_error!r}"
            return PermanentFailure(detail) if exc.smtp_code >= 500 else TemporaryFailure(detail)
        except (TimeoutError, smtplib.SMTPException, OSError) as exc:
            return TemporaryFailure(f"SMTP unavailable: {type(exc).__name__}: {exc}")
        return Accepted(message_id)
