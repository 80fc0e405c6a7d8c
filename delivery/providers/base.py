"""The provider interface: one message in, one of three answers out (contract section 4).

Every attempt at one notification on one channel carries the same idempotency key, so a
provider that already accepted it answers as before and does not send a second copy.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class Message:
    notification_id: uuid.UUID
    channel: str
    recipient: str
    subject: str
    body: str
    metadata: dict[str, Any] = field(default_factory=dict)
    # Headers the message must carry (an email's List-Unsubscribe and List-Unsubscribe-Post):
    # the smtp provider writes them into the message, the http provider sends them as
    # `headers`.
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def idempotency_key(self) -> str:
        return f"{self.notification_id}:{self.channel}"


@dataclass(frozen=True)
class Accepted:
    message_id: str | None
    """The provider's id for the message; None when it gave no usable one."""


@dataclass(frozen=True)
class PermanentFailure:
    """The provider refused the message; trying again cannot help."""

    error: str


@dataclass(frozen=True)
class TemporaryFailure:
    """The provider could not take the message now (down, overloaded, timed out)."""

    error: str


ProviderResult = Accepted | PermanentFailure | TemporaryFailure


class Provider(Protocol):
    name: str

    def send(self, message: Message) -> ProviderResult:
        """Delivers the message or says why not. Must not raise for provider-side trouble."""
        ...


@runtime_checkable
class BatchProvider(Provider, Protocol):
    """A provider whose sending is a write to our own database (the simulated provider, the
    in-app inbox): the worker hands it a whole claim at once, on its loop, instead of one
    message per send thread."""

    def send_batch(self, messages: list[Message]) -> list[ProviderResult]:
        """One answer per message, in order."""
        ...
