"""A provider reached over HTTP (contract section 4).

POST <url> with `Idempotency-Key` and a JSON body. 2xx with `message_id`: accepted.
4xx other than 408 and 429: permanent. 5xx, 408, 429, a timeout or a connection error:
temporary.
"""

from __future__ import annotations

import threading

import requests

from delivery.providers.base import (
    Accepted,
    Message,
    PermanentFailure,
    ProviderResult,
    TemporaryFailure,
)

_TEMPORARY_4XX = {408, 429}


class HttpProvider:
    name = "http"

    def __init__(self, *, url: str, timeout_s: float) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self._local = threading.local()

    def send(self, message: Message) -> ProviderResult:
        body = {
            "id": str(message.notification_id),
            "channel": message.channel,
            "recipient": message.recipient,
            "subject": message.subject,
            "body": message.body,
            "metadata": message.metadata,
        }
        try:
            response = self._session().post(
                self.url,
                json=body,
                headers={"Idempotency-Key": message.idempotency_key},
                timeout=self.timeout_s,
            )
        except requests.Timeout:
            return TemporaryFailure(f"provider timed out after {self.timeout_s:g}s")
        except requests.RequestException as exc:
            return TemporaryFailure(f"provider unreachable: {type(exc).__name__}: {exc}")
        status = response.status_code
        if 200 <= status < 300:
            try:
                message_id = str(response.json()["message_id"])
            except (ValueError, KeyError, TypeError):
                return TemporaryFailure(f"provider answered {status} without a message_id")
            return Accepted(message_id)
        detail = f"provider answered {status}: {response.text[:500]}"
        if 400 <= status < 500 and status not in _TEMPORARY_4XX:
            return PermanentFailure(detail)
        return TemporaryFailure(detail)

    def _session(self) -> requests.Session:
        # One session per delivery thread: connection reuse without sharing across threads.
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
        return session
