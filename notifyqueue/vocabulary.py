"""The terms every app shares about a notification: its channels and priorities, what an
address on each channel looks like, and the size limits of what is sent.

The notifications app owns the table; templates, preferences, rate limits and monitoring sit
below it (docs/technical-design.md, Layers) and speak these terms without importing it.
"""

from __future__ import annotations

import re

from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import EmailValidator
from django.db import models

# A push device token may be up to 4,096 characters (contract: recipient plausibility).
RECIPIENT_MAX_LENGTH = 4096
USER_ID_MAX_LENGTH = 255
EMAIL_MAX_LENGTH = 320
# A message body (given, or rendered from a template), in bytes of UTF-8.
MAX_BODY_BYTES = 64 * 1024
SMS_NUMBER = re.compile(r"\+[1-9][0-9]{6,14}")
PUSH_TOKEN = re.compile(rf"[\x21-\x7e]{{8,{RECIPIENT_MAX_LENGTH}}}")
# What an email subject (a mail header line) may not hold: every control character but tab
# (C0, DEL and C1; among them CR, LF, \v, \f, \x1c-\x1e and \x85, which Python's mail
# package and str.splitlines() treat as line ends) and the Unicode line and paragraph
# separators. Any of them could end the header and start another.
HEADER_BREAKS = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
# A lone surrogate: JSON can carry one (a `\ud800` escape), UTF-8 and PostgreSQL cannot.
LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_email_validator = EmailValidator()


class Channel(models.TextChoices):
    EMAIL = "email"
    SMS = "sms"
    PUSH = "push"
    IN_APP = "in_app"


class Priority(models.IntegerChoices):
    """Stored as a small integer so that ascending order is the order of one client's rows."""

    CRITICAL = 0
    HIGH = 1
    NORMAL = 2
    LOW = 3


def recipient_problem(channel: str, recipient: str) -> str | None:
    """Why `recipient` cannot be an address on `channel`, or None when it is plausible."""
    if channel == Channel.EMAIL:
        if len(recipient) > EMAIL_MAX_LENGTH:
            return f"An email address is at most {EMAIL_MAX_LENGTH} characters."
        # Django's validator takes some control characters in a quoted local part, and the
        # mail package would end the To: line at one of them.
        if HEADER_BREAKS.search(recipient):
            return "Not a valid email address."
        try:
            _email_validator(recipient)
        except DjangoValidationError:
            return "Not a valid email address."
        return None
    if channel == Channel.SMS:
        if SMS_NUMBER.fullmatch(recipient) is None:
            return "An SMS recipient is an E.164 number: + and 7 to 15 digits, e.g. +447700900123."
        return None
    if channel == Channel.PUSH:
        if PUSH_TOKEN.fullmatch(recipient) is None:
            return (
                f"A push recipient is a device token: 8 to {RECIPIENT_MAX_LENGTH} printable "
                "characters without spaces."
            )
        return None
    if not 1 <= len(recipient) <= USER_ID_MAX_LENGTH:
        return f"An in_app recipient is a user id of 1 to {USER_ID_MAX_LENGTH} characters."
    return None
