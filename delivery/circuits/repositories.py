"""The circuit breakers' database access: the only code that runs `sql/circuits.sql`.

Invariants protected here:
- at most one probe per circuit is ever out at a time, across all workers and processes: it
  is handed out by one conditional UPDATE that only one caller can win;
- only the holder of the current probe token moves a circuit out of HALF_OPEN;
- the consecutive-failure count is updated under the row lock, so concurrent failures are
  all counted and exactly one of them opens the circuit;
- every time (opened, cooldown over, probe expiry) is the database's clock.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from notifyqueue.sqlgateway import Queries

SQL = Queries(Path(__file__).with_name("sql") / "circuits.sql")


@dataclass(frozen=True)
class CircuitRecord:
    """What /status, /metrics and the admin show of one circuit."""

    name: str
    state: str
    consecutive_failures: int
    opened_at: datetime | None


@dataclass(frozen=True)
class CircuitReading:
    """What a worker needs to decide whether it may call the provider."""

    state: str
    consecutive_failures: int
    opened_at: datetime | None
    probe_expires_at: datetime | None
    # By the database's clock: an OPEN circuit's cooldown (or a probe) has run out.
    probe_due: bool = False


def circuits_list() -> list[CircuitRecord]:
    """Every provider's circuit, by name (for /status, /metrics and operators)."""
    return SQL.rows("circuits_list", row=CircuitRecord)


class CircuitRepository:
    def register(self, *, names: list[str]) -> None:
        """Makes sure each named circuit has a row (CLOSED when new), so all are listed."""
        SQL.execute("circuit_register", names=names)

    def read(self, *, name: str, cooldown_s: float) -> CircuitReading | None:
        return SQL.row("circuit_read", row=CircuitReading, name=name, cooldown_s=cooldown_s)

    def probe_take(
        self, *, name: str, cooldown_s: float, probe_timeout_s: float
    ) -> uuid.UUID | None:
        """The probe token if this caller won the probe; None if another caller holds it or
        the cooldown has not passed."""
        return SQL.scalar(
            "circuit_probe_take",
            name=name,
            cooldown_s=cooldown_s,
            probe_timeout_s=probe_timeout_s,
        )

    def probe_finished(self, *, name: str, token: uuid.UUID, failed: bool) -> bool:
        """Closes (or, when `failed`, reopens) the circuit; False when the token is no longer
        the current probe's (it expired and was taken over)."""
        statement = "circuit_probe_failed" if failed else "circuit_probe_succeeded"
        return SQL.execute(statement, name=name, token=token) == 1

    def succeeded(self, *, name: str) -> None:
        SQL.execute("circuit_succeeded", name=name)

    def failed(self, *, name: str, threshold: int) -> None:
        SQL.execute("circuit_failed", name=name, threshold=threshold)
