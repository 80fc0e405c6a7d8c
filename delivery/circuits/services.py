"""The circuit breaker's rules: when a provider may be called, and what its answer does.

Invariants decided here:
- CLOSED lets every call through; NOTIFYQUEUE_CIRCUIT_FAILURE_THRESHOLD temporary failures in
  a row open the circuit;
- OPEN fails fast: the provider is not called, and the caller gets a Refused; the worker
  holds the notification without using an attempt until the probe time, for at most
  NOTIFYQUEUE_CIRCUIT_MAX_HOLD_SECONDS (delivery/sql/functions/notification_circuit_hold_many.sql);
- once NOTIFYQUEUE_CIRCUIT_COOLDOWN_SECONDS have passed, one probe call goes through (one for
  all workers: the repository hands it out); its success closes the circuit and its failure
  opens it again for another cooldown;
- only temporary failures count: a permanent rejection is a provider that answered, so it
  ends a failure run like a success.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from dataclasses import dataclass

from delivery.circuits.models import CircuitState
from delivery.circuits.repositories import CircuitReading, CircuitRepository
from delivery.providers.base import ProviderResult, TemporaryFailure


@dataclass(frozen=True)
class CircuitPolicy:
    threshold: int
    cooldown_s: float
    # A probe not reported back within this long (its worker died) may be taken over.
    probe_timeout_s: float
    # How long one worker reuses a reading of the shared state before reading it again. Saves
    # a query per message; another worker's change of state reaches this one within it.
    read_ttl_s: float = 0.5
    # The longest a notification is held while its circuit stays open before it is
    # dead-lettered (NOTIFYQUEUE_CIRCUIT_MAX_HOLD_SECONDS).
    max_hold_s: float = 86_400.0


@dataclass(frozen=True)
class Allowed:
    # Set when this call is the circuit's probe; its result decides the circuit's state.
    probe_token: uuid.UUID | None = None


@dataclass(frozen=True)
class Refused:
    reason: str


def circuits_register(
    circuits: list[Circuit], *, repository: CircuitRepository | None = None
) -> None:
    """Gives each circuit its row, so every provider is listed before any of them fails."""
    if circuits:
        (repository or CircuitRepository()).register(names=[c.name for c in circuits])


class Circuit:
    """One provider's breaker, as one worker sees it; the state itself is in PostgreSQL."""

    def __init__(
        self, name: str, policy: CircuitPolicy, repository: CircuitRepository | None = None
    ) -> None:
        self.name = name
        self.policy = policy
        self.repository = repository or CircuitRepository()
        # The worker's loop is its only user, but a circuit stays safe to share between
        # threads; a stale reading is harmless because every change of state is decided by a
        # guarded UPDATE in the repository.
        self._lock = threading.Lock()
        self._reading: CircuitReading | None = None
        self._read_at = -math.inf

    def admit(self) -> Allowed | Refused:
        reading = self._current()
        if reading is None or reading.state == CircuitState.CLOSED:
            return Allowed()
        if reading.probe_due:
            token = self.repository.probe_take(
                name=self.name,
                cooldown_s=self.policy.cooldown_s,
                probe_timeout_s=self.policy.probe_timeout_s,
            )
            self._forget()
            if token is not None:
                return Allowed(probe_token=token)
        return Refused(f"circuit open: {self.name} is failing; the provider was not called")

    def record(self, admission: Allowed, result: ProviderResult) -> bool:
        """Reports the call's answer; True when it closed the circuit (its probe succeeded),
        so that the notifications it held may go now."""
        failed = isinstance(result, TemporaryFailure)
        if admission.probe_token is not None:
            closed = self.repository.probe_finished(
                name=self.name, token=admission.probe_token, failed=failed
            )
            self._forget()
            return closed and not failed
        if failed:
            self.repository.failed(name=self.name, threshold=self.policy.threshold)
            self._forget()  # the next call sees the new count, or the circuit open
        elif self._failure_run_seen():
            # Only a success that ends a failure run writes; the common case costs nothing.
            self.repository.succeeded(name=self.name)
            self._forget()
        return False

    def _current(self) -> CircuitReading | None:
        with self._lock:
            if time.monotonic() - self._read_at >= self.policy.read_ttl_s:
                self._reading = self.repository.read(
                    name=self.name, cooldown_s=self.policy.cooldown_s
                )
                self._read_at = time.monotonic()
            return self._reading

    def _forget(self) -> None:
        with self._lock:
            self._read_at = -math.inf

    def _failure_run_seen(self) -> bool:
        with self._lock:
            return self._reading is None or self._reading.consecutive_failures > 0
