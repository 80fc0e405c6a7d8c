"""A provider reached over HTTP (contract section 4), through the guarded outbound transport
(notifyqueue/outbound.py: the address checked at connect time, no redirects, no proxy
variables, one total deadline of NOTIFYQUEUE_PROVIDER_TIMEOUT_SECONDS per call, at most
64 KiB of the answer read).

POST <url> with `Idempotency-Key` and a JSON body. Every answer ends as one of three results:

- 2xx: accepted. The provider's `message_id` is kept when the body is a JSON object whose
  `message_id` is a string or an integer: control characters are dropped and it is cut to
  MESSAGE_ID_MAX_CHARS. Any other 2xx body (not JSON, not an object, no or an unusable id, or
  longer than the 64 KiB read, so cut and no longer JSON) is still an acceptance, recorded
  without a message id: the provider took the message, and sending it again could deliver it
  twice.
- 4xx other than 408 and 429: permanent.
- 5xx, 408, 429, any other status, a timeout, a connection error, a DNS failure: temporary.
- 3xx: temporary. A redirect says nothing about the message; it means the provider's URL is
  wrong or has moved, which the operator must fix. Temporary keeps the message (it is
  retried, and dead-lettered for an operator retry if the URL stays wrong) and counts against
  the provider's circuit, so the circuit opens and the failure is visible.
- A provider URL the address rules refuse (its name now resolves to a private address):
  temporary, for the same reason.

Errors are short classes and status codes ("http 503", "timeout", "redirect 307 not
followed"): clients read them in `last_error`, so the provider's own text never reaches them.
"""

from __future__ import annotations

import json

from delivery.providers.base import (
    Accepted,
    Message,
    PermanentFailure,
    ProviderResult,
    TemporaryFailure,
)
from notifyqueue.outbound import MAX_BODY_BYTES, outbound_post

_TEMPORARY_4XX = {408, 429}
# The longest provider message id kept; a longer one is cut to this length.
MESSAGE_ID_MAX_CHARS = 1000
USER_AGENT = "NotifyQueue-Provider/1.0"


def provider_message_id(body: bytes) -> str | None:
    """The usable `message_id` in a 2xx body, or None."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(document, dict):
        return None
    value = document.get("message_id")
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None
    # str() of a huge int raises ValueError past 4300 digits; such an id is unusable anyway.
    try:
        text = value if isinstance(value, str) else str(value)
    except ValueError:
        return None
    # PostgreSQL text holds no NUL, and lone surrogates cannot be encoded: keep printable text.
    cleaned = "".join(ch for ch in text if ch.isprintable())[:MESSAGE_ID_MAX_CHARS]
    return cleaned or None


class HttpProvider:
    name = "http"

    def __init__(self, *, url: str, timeout_s: float, allow_private: bool = True) -> None:
        # The URL is the operator's, not a client's; providers_from_settings() passes
        # NOTIFYQUEUE_WEBHOOK_ALLOW_PRIVATE, so a deployment applies the address rules.
        self.url = url
        self.timeout_s = timeout_s
        self.allow_private = allow_private

    def send(self, message: Message) -> ProviderResult:
        body = {
            "id": str(message.notification_id),
            "channel": message.channel,
            "recipient": message.recipient,
            "subject": message.subject,
            "body": message.body,
            "metadata": message.metadata,
        }
        if message.headers:
            body["headers"] = message.headers
        answer = outbound_post(
            url=self.url,
            body=json.dumps(body).encode(),
            headers={
                "Content-Type": "application/json",
                "User-Agent": USER_AGENT,
                "Idempotency-Key": message.idempotency_key,
            },
            timeout_s=self.timeout_s,
            allow_private=self.allow_private,
            max_body_bytes=MAX_BODY_BYTES,
        )
        status = answer.status_code
        if status is None:
            return TemporaryFailure(
                "provider address refused" if answer.refused else answer.failure
            )
        if 200 <= status < 300:
            return Accepted(provider_message_id(answer.body))
        if 300 <= status < 400:
            return TemporaryFailure(f"redirect {status} not followed")
        if 400 <= status < 500 and status not in _TEMPORARY_4XX:
            return PermanentFailure(f"http {status}")
        return TemporaryFailure(f"http {status}")
