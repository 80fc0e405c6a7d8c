"""A provider for development and tests that behaves like a real one (contract section 4).

Its idempotency store is a PostgreSQL table shared by every worker, so a resend with a known
key is answered as before and not sent again. Recipients containing `permanent-failure`
always reject, `temporary-failure` always fail temporarily, and `flaky-N` fail temporarily on
their first N calls; otherwise a send fails temporarily with probability `failure_rate`.
"""

from __future__ import annotations

import random
import re
import uuid

from delivery.providers.base import (
    Accepted,
    Message,
    PermanentFailure,
    ProviderResult,
    TemporaryFailure,
)
from delivery.repositories import DeliveryRepository

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
        recipient = message.recipient

        def decide(calls: int) -> tuple[str | None, str | None]:
            if "permanent-failure" in recipient:
                return REJECTED, None
            if "temporary-failure" in recipient:
                return None, None
            flaky = _FLAKY.search(recipient)
            if flaky and calls <= int(flaky.group(1)):
                return None, None
            if not flaky and self.rng.random() < self.failure_rate:
                return None, None
            return ACCEPTED, f"sim-{uuid.uuid4()}"

        call = self.repository.simulated_message_call(
            key=message.idempotency_key,
            channel=message.channel,
            recipient=recipient,
            decide=decide,
        )
        if call.outcome == ACCEPTED:
            return Accepted(call.message_id)
        if call.outcome == REJECTED:
            return PermanentFailure(f"simulated provider rejected {recipient}")
        return TemporaryFailure(f"simulated provider unavailable (call {call.calls})")
