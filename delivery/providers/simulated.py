"""A provider for development and tests that behaves like a real one (contract section 4).

Its idempotency store is a PostgreSQL table shared by every worker, so a resend with a known
key is answered as before and not sent again. Recipients containing `permanent-failure`
always reject, `temporary-failure` always fail temporarily, and `flaky-N` fail temporarily on
their first N calls; otherwise a send fails temporarily with probability `failure_rate`.
"""

from __future__ import annotations

import random
import re
import secrets

from delivery.providers.base import (
    Accepted,
    Message,
    PermanentFailure,
    ProviderResult,
    TemporaryFailure,
)
from delivery.repositories import DeliveryRepository, SimulatedCall

_FLAKY = re.compile(r"flaky-(\d+)")
ACCEPTED, REJECTED = "ACCEPTED", "REJECTED"


class SimulatedProvider:
    name = "simulated"

    def __init__(
        self,
        *,
        failure_rate: float = 0.0,
        repository: DeliveryRepository | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.failure_rate = failure_rate
        self.repository = repository or DeliveryRepository()
        self.rng = rng or random.Random()

    def send(self, message: Message) -> ProviderResult:
        return self.send_batch([message])[0]

    def send_batch(self, messages: list[Message]) -> list[ProviderResult]:
        """One round trip to the store for the batch (two when new answers are settled)."""
        if not messages:
            return []
        keys = [m.idempotency_key for m in messages]
        calls = self.repository.simulated_messages_call(
            [(key, m.channel, m.recipient) for key, m in zip(keys, messages, strict=True)],
            self._decide,
        )
        return [
            self._answer(calls[key], m.recipient) for key, m in zip(keys, messages, strict=True)
        ]

    def _decide(self, calls: int, recipient: str) -> tuple[str | None, str | None]:
        """The answer to the `calls`-th call for a key that has no final answer yet."""
        if "permanent-failure" in recipient:
            return REJECTED, None
        if "temporary-failure" in recipient:
            return None, None
        flaky = _FLAKY.search(recipient)
        if flaky and calls <= int(flaky.group(1)):
            return None, None
        if not flaky and self.rng.random() < self.failure_rate:
            return None, None
        # 128 random bits, as a UUID has, without building one (per message, on the hot path).
        return ACCEPTED, f"sim-{secrets.token_hex(16)}"

    @staticmethod
    def _answer(call: SimulatedCall, recipient: str) -> ProviderResult:
        if call.outcome == ACCEPTED:
            return Accepted(call.message_id)
        if call.outcome == REJECTED:
            return PermanentFailure(f"simulated provider rejected {recipient}")
        return TemporaryFailure(f"simulated provider unavailable (call {call.calls})")
