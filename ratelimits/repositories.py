"""The rolling-window rate limit's database access: the only code that runs
`ratelimits/sql/ratelimits.sql`.

Invariants protected here:
- a window is per (channel, client, recipient), the recipient in its counting form
  (`notifyqueue.addresses.recipient_key`, computed here from the claim's channel and recipient
  as they are at send time), with an optional ceiling per address across clients;
- a key's check-and-record is serialised by a transaction-level advisory lock on the key, so
  two workers cannot both take its last slot;
- a deferred notification goes back to PENDING with its attempt returned, due when a slot
  frees, and only if the caller still holds its claim;
- a freed slot (a failed attempt, a slot left over) lets the next held row of its key go;
- every time is the database's (notifyqueue_now()), never the caller's clock.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from django.db import transaction

from notifyqueue.addresses import recipient_key
from notifyqueue.sqlgateway import Queries

SQL = Queries(Path(__file__).with_name("sql") / "ratelimits.sql")


@dataclass(frozen=True)
class Admitted:
    pass


@dataclass(frozen=True)
class Deferred:
    due_at: datetime


@dataclass(frozen=True)
class ClaimLost:
    """The claim expired and was taken over while waiting for the lock: do nothing."""


Admission = Admitted | Deferred | ClaimLost


@dataclass(frozen=True)
class AdmissionRequest:
    """One claimed row to admit: its key's parts and the claim it is admitted under."""

    channel: str
    client_id: uuid.UUID
    recipient: str
    notification_id: uuid.UUID
    claim_token: uuid.UUID
    critical: bool


@dataclass(frozen=True)
class _AdmitManyRow:
    """ratelimit_admit_many's row: one claimed row, and whether it was admitted."""

    notification_id: uuid.UUID
    admitted: bool


class RateLimitRepository:
    def recipients_admit(
        self, *, claims: list[AdmissionRequest], limit: int, window_s: float, ceiling: int = 0
    ) -> set[uuid.UUID]:
        """Records a delivery for each claimed row whose key has a slot, in one statement (the
        keys locked in one global order); returns the ids admitted. A row left out was at its
        key's limit when checked: `recipient_admit` it to check again and defer it."""
        if not claims:
            return set()
        rows = SQL.rows(
            "ratelimit_admit_many",
            row=_AdmitManyRow,
            channels=[c.channel for c in claims],
            client_ids=[c.client_id for c in claims],
            recipients=[c.recipient for c in claims],
            recipient_keys=[recipient_key(c.channel, c.recipient) for c in claims],
            ids=[c.notification_id for c in claims],
            claim_tokens=[c.claim_token for c in claims],
            criticals=[c.critical for c in claims],
            limit=limit,
            ceiling=ceiling,
            window_s=window_s,
        )
        return {r.notification_id for r in rows if r.admitted}

    def recipient_admit(
        self,
        *,
        channel: str,
        client_id: uuid.UUID,
        recipient: str,
        notification_id: uuid.UUID,
        claim_token: uuid.UUID,
        critical: bool,
        limit: int,
        window_s: float,
        ceiling: int = 0,
    ) -> Admission:
        """Records a delivery for the recipient if it has a slot (CRITICAL always has one);
        otherwise defers the notification to the moment a slot frees."""
        params = {
            "channel": channel,
            "client_id": client_id,
            "recipient": recipient,
            "recipient_key": recipient_key(channel, recipient),
            "notification_id": notification_id,
            "claim_token": claim_token,
            "critical": critical,
            "limit": limit,
            "ceiling": ceiling,
            "window_s": window_s,
        }
        if SQL.scalar("ratelimit_admit", **params):
            return Admitted()
        # At the limit. Check again inside a transaction, whose advisory lock then stays held
        # until the deferral (computed from what is committed now) is written.
        with transaction.atomic():
            if SQL.scalar("ratelimit_admit", **params):
                return Admitted()
            deferred = SQL.row("ratelimit_defer", row=Deferred, **params)
        return deferred if deferred is not None else ClaimLost()

    def ratelimit_release_freed(self, freed: list[tuple[str, uuid.UUID, str, uuid.UUID]]) -> None:
        """For each (channel, client, recipient, notification) whose failed attempt freed a
        slot, lets the next row a deferral holds back for that key go now."""
        if not freed:
            return
        channels, client_ids, recipients, ids = (
            list(column) for column in zip(*freed, strict=True)
        )
        SQL.execute(
            "ratelimit_release_freed",
            channels=channels,
            client_ids=client_ids,
            recipients=recipients,
            ids=ids,
        )

    def ratelimit_prune(self, *, window_s: float, limit: int = 10_000) -> int:
        return SQL.execute("ratelimit_prune", window_s=window_s, limit=limit)
