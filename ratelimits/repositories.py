"""The rolling-window rate limit's database access: the only code that runs
`ratelimits/sql/ratelimits.sql`.

Invariants protected here:
- a window is per (channel, client, recipient), the recipient in its counting form
  (`notifyqueue.addresses.recipient_key`, computed here from the claim's channel and recipient
  as they are at send time), with an optional ceiling per address across clients;
- a key's check-and-record is serialised by a transaction-level advisory lock on the key, so
  two workers cannot both take its last slot;
- a deferred notification goes back to PENDING with its attempt returned, due when a slot
  frees, and only if the caller still holds its claim; a deferral moves a bounded number of
  the key's rows, whatever its backlog;
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
class _DeferManyRow:
    """ratelimit_defer_many's row: one deferred claim, and when it is due."""

    notification_id: uuid.UUID
    due_at: datetime


@dataclass(frozen=True)
class _AdmitManyRow:
    """ratelimit_admit_many's row: one claimed row, and whether it was admitted."""

    notification_id: uuid.UUID
    admitted: bool


def _claim_columns(claims: list[AdmissionRequest]) -> dict[str, list]:
    """The claims as the admission's and the deferral's array parameters, a column each."""
    return {
        "channels": [c.channel for c in claims],
        "client_ids": [c.client_id for c in claims],
        "recipients": [c.recipient for c in claims],
        "recipient_keys": [recipient_key(c.channel, c.recipient) for c in claims],
        "ids": [c.notification_id for c in claims],
        "claim_tokens": [c.claim_token for c in claims],
    }


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
            **_claim_columns(claims),
            criticals=[c.critical for c in claims],
            limit=limit,
            ceiling=ceiling,
            window_s=window_s,
        )
        return {r.notification_id for r in rows if r.admitted}

    def recipients_defer(
        self,
        *,
        claims: list[AdmissionRequest],
        limit: int,
        window_s: float,
        ceiling: int = 0,
        ahead: int,
    ) -> dict[uuid.UUID, Admission]:
        """The claims `recipients_admit` left out, in one transaction: checked again under
        their keys' locks (a slot may have freed since), and those still over their limits
        deferred in one statement for all their keys, to the moment a slot frees for each.
        Each key's deferral moves its claimed rows and its rows among the first `ahead` due
        rows of the client's pairs, whatever its backlog. A claim neither admitted nor
        deferred was lost meanwhile (expired and taken over): `ClaimLost`."""
        if not claims:
            return {}
        # The admission's locks stay held until the deferral (computed from what is committed
        # now) is written.
        with transaction.atomic():
            admitted = self.recipients_admit(
                claims=claims, limit=limit, window_s=window_s, ceiling=ceiling
            )
            over = [c for c in claims if c.notification_id not in admitted]
            rows = (
                SQL.rows(
                    "ratelimit_defer_many",
                    row=_DeferManyRow,
                    **_claim_columns(over),
                    limit=limit,
                    ceiling=ceiling,
                    window_s=window_s,
                    ahead=ahead,
                )
                if over
                else []
            )
        deferred = {r.notification_id: Deferred(r.due_at) for r in rows}
        return {
            c.notification_id: Admitted()
            if c.notification_id in admitted
            else deferred.get(c.notification_id, ClaimLost())
            for c in claims
        }

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
