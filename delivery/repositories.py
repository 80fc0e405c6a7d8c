"""The delivery worker's database access: the only code that runs `delivery/sql/queries.sql`;
and retention's, the only code that runs `delivery/sql/retention.sql`.

Invariants protected here:
- a row is claimed by at most one worker at a time (FOR UPDATE SKIP LOCKED, then PROCESSING
  under a fresh claim token), and no lock is held after the claim statement commits;
- a result is applied only by the holder of the current claim token (guarded UPDATE), so a
  worker whose claim was taken over (it was dead, or the claim expired) changes nothing;
- an attempt is counted when claimed, so a row that kills its worker still runs out of attempts;
- every time (due, claim expiry, attempt start and end) is the database's clock,
  notifyqueue_now(), never the worker's;
- a result that cannot be written with its batch is written on its own, and a result that
  cannot be written at all still ends its row (dead-lettered with the reason): no row is ever
  left waiting for its claim to expire because of what a provider answered;
- retention deletes only rows that finished before its cutoff (database clock), with every
  row that refers to them, in short batches that skip rows another transaction holds.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, transaction

from notifications.repositories import ListPosition
from notifyqueue.sqlgateway import Queries
from notifyqueue.vocabulary import Channel

# The tables every claim and finish writes and reads by more than a primary key, whose
# statistics the worker keeps fresh. Not the record (`notification`): the hot path reads it
# by primary key only, and sampling it (30,000 rows of a table of millions) held the loop
# for ~400 ms at 1,000,000 rows.
HOT_TABLES = ("delivery_attempt", "notification_queue", "ratelimit_delivery")
# The narrow tables of what is not yet final, whose rows are deleted as they finish: a drain
# leaves them dead rows that every claim steps over until VACUUM (upkeep.QueueVacuumer).
QUEUE_TABLES = ("notification_queue", "webhook_queue")

SQL = Queries(Path(__file__).with_name("sql") / "queries.sql")

log = logging.getLogger("notifyqueue.delivery")


@dataclass(frozen=True)
class Claim:
    """A notification this worker holds, with what it needs to deliver it."""

    id: uuid.UUID
    claim_token: uuid.UUID
    client_id: uuid.UUID
    channel: str
    recipient: str
    subject: str
    body: str
    metadata: dict[str, Any]
    priority: int
    attempt_count: int
    max_attempts: int
    # Preference mode (user_id set): what a send-time re-check or a fallback re-renders from.
    user_id: str | None = None
    template: str | None = None
    payload: dict[str, Any] | None = None
    fallback_channels: tuple[str, ...] = ()
    # Seconds left before the row's expiry when it was claimed, by the database clock (<= 0:
    # expired); None when it has none (or an earlier send of it started: that one goes on).
    expires_in_s: float | None = None
    # A cancel by key may still take the claim until its send is marked started.
    cancellable: bool = False

    @property
    def start_checked(self) -> bool:
        """Whether its send must be marked started, in a last check by the database, just
        before the provider call (`notification_send_start`)."""
        return self.cancellable or self.expires_in_s is not None

    def __post_init__(self) -> None:
        # The claim statement answers NULL for an empty metadata object and an empty fallback
        # list; its jsonb array arrives as a list, and a claim keeps its fallbacks immutable.
        if self.metadata is None:
            object.__setattr__(self, "metadata", {})
        if type(self.fallback_channels) is not tuple:
            object.__setattr__(self, "fallback_channels", tuple(self.fallback_channels or ()))


@dataclass(frozen=True)
class Finish:
    """How one claim ends: the row's next status and what the attempt records."""

    id: uuid.UUID
    claim_token: uuid.UUID
    status: str
    outcome: str
    error: str | None = None
    message_id: str | None = None
    # Seconds from now (the database's now) until the row is next due (a retry or fallback);
    # None keeps the current due time.
    delay_s: float | None = None
    # -1 gives the attempt back (the message was never tried); 0 keeps it counted.
    attempt_delta: int = 0
    # A channel switch (fallback): the row's new channel, address, rendered content and
    # remaining fallbacks, with its attempts reset to 0. None keeps the current value.
    channel: str | None = None
    recipient: str | None = None
    subject: str | None = None
    body: str | None = None
    fallback_channels: tuple[str, ...] | None = None
    attempt_reset: bool = False


@dataclass(frozen=True)
class QueueRows:
    """A queue table's rows by PostgreSQL's statistics: deleted but not yet vacuumed, and
    live."""

    table: str
    dead: int
    live: int


@dataclass(frozen=True)
class Finished:
    """A result that was applied, and whether the attempt's rate-limit slot was freed."""

    id: uuid.UUID
    status: str
    channel: str
    client_id: uuid.UUID
    recipient: str
    freed_slot: bool


@dataclass(frozen=True)
class Hold:
    """A claim refused by its provider's open circuit: the provider was never asked."""

    id: uuid.UUID
    claim_token: uuid.UUID
    # The circuit that refused it (`<channel>:<provider>`), whose probe time it waits for.
    circuit: str


@dataclass(frozen=True)
class Held(Finished):
    """A hold that was applied: PENDING until `held_until`, or DEAD_LETTERED (None) once held
    past the maximum hold."""

    held_until: datetime | None


@dataclass(frozen=True)
class QuietHeld:
    """A claim its user's quiet hours held: PENDING, its attempt returned, until `held_until`."""

    id: uuid.UUID
    held_until: datetime


@dataclass(frozen=True)
class _SendStart:
    id: uuid.UUID
    # "started" or "expired"
    state: str


@dataclass(frozen=True)
class Expired:
    """A waiting row the upkeep ended EXPIRED."""

    id: uuid.UUID
    client_id: uuid.UUID
    channel: str


@dataclass(frozen=True)
class Reclaimed:
    id: uuid.UUID
    status: str
    # Why the claim was taken: `dead_worker` or `claim_timeout`.
    cause: str


@dataclass(frozen=True)
class SimulatedCall:
    calls: int
    outcome: str | None
    message_id: str | None


@dataclass(frozen=True)
class _SimulatedCallRow:
    """simulated_messages_call's row: the call, and the key it was counted under."""

    idempotency_key: str
    calls: int
    outcome: str | None
    message_id: str | None


@dataclass(frozen=True)
class _SimulatedAnswer:
    """A key's final answer (simulated_messages_answer, simulated_messages_get)."""

    idempotency_key: str
    outcome: str | None
    message_id: str | None


class DeliveryRepository:
    def notification_claim_due(
        self,
        *,
        worker: str,
        limit: int,
        claim_timeout_s: float,
        aging_s: float = 0.0,
        held: Mapping[uuid.UUID, int] | None = None,
    ) -> list[Claim]:
        """Up to `limit` due rows, in claim order: CRITICAL first, then clients in turn, a
        client's turns counted from the claims the worker already `held` for it, each
        client's rows by priority, aged one level per `aging_s` overdue (0: no aging)."""
        held = held or {}
        return SQL.rows(
            "notification_claim_due",
            row=Claim,
            worker=worker,
            limit=limit,
            claim_timeout_s=claim_timeout_s,
            aging_s=aging_s,
            held_clients=list(held),
            held_counts=list(held.values()),
        )

    def notification_finish(self, finishes: list[Finish]) -> list[Finished]:
        """Applies results; returns the rows it changed (a stale token is simply absent).

        One statement for the batch. If it fails for anything but a lost connection (which
        the caller retries with the results kept), each result is applied on its own, and one
        that still fails ends its row as DEAD_LETTERED with the reason. Raises only when the
        database is unreachable."""
        if not finishes:
            return []
        try:
            return self._finish(finishes)
        except (OperationalError, InterfaceError):
            raise
        except DatabaseError:
            log.exception(
                "batched finish of %d results failed; applying them one by one", len(finishes)
            )
        finished: list[Finished] = []
        for finish in finishes:
            try:
                finished += self._finish([finish])
            except (OperationalError, InterfaceError):
                raise
            except DatabaseError as exc:
                log.exception("result of notification=%s cannot be recorded", finish.id)
                finished += self._finish_unrecordable(finish, exc)
        return finished

    def notification_circuit_hold(
        self, holds: list[Hold], *, cooldown_s: float, max_hold_s: float
    ) -> list[Held]:
        """Gives refused claims back without using an attempt, in one statement; returns the
        rows it changed (a stale token is simply absent)."""
        if not holds:
            return []
        return SQL.rows(
            "notification_circuit_hold",
            row=Held,
            ids=[h.id for h in holds],
            tokens=[h.claim_token for h in holds],
            circuits=[h.circuit for h in holds],
            cooldown_s=cooldown_s,
            max_hold_s=max_hold_s,
        )

    def notification_quiet_hold(self, claims: list[Claim]) -> list[QuietHeld]:
        """Gives back, without using an attempt, the claims their users' quiet hours hold now
        (one statement); returns those. The others go on (a stale token is simply absent)."""
        if not claims:
            return []
        return SQL.rows(
            "notification_quiet_hold",
            row=QuietHeld,
            ids=[c.id for c in claims],
            tokens=[c.claim_token for c in claims],
            channels=[c.channel for c in claims],
        )

    def notification_circuit_release(self, *, channel: str) -> int:
        """The channel's circuit closed: its held rows are due now; how many."""
        return SQL.scalar("notification_circuit_release", channel=channel)

    def _finish_unrecordable(self, finish: Finish, exc: DatabaseError) -> list[Finished]:
        reason = (
            f"result {finish.outcome} could not be recorded ({type(exc).__name__}); "
            "dead-lettered so the notification does not wait for its claim to expire"
        )
        return SQL.rows(
            "notification_finish_unrecordable",
            row=Finished,
            id=finish.id,
            token=finish.claim_token,
            reason=reason,
        )

    def _finish(self, finishes: list[Finish]) -> list[Finished]:
        return SQL.rows(
            "notification_finish",
            row=Finished,
            ids=[f.id for f in finishes],
            tokens=[f.claim_token for f in finishes],
            statuses=[f.status for f in finishes],
            outcomes=[f.outcome for f in finishes],
            errors=[_text(f.error) for f in finishes],
            message_ids=[_text(f.message_id) for f in finishes],
            delays=[f.delay_s for f in finishes],
            attempt_deltas=[f.attempt_delta for f in finishes],
            attempt_resets=[f.attempt_reset for f in finishes],
            channels=[f.channel for f in finishes],
            recipients=[f.recipient for f in finishes],
            subjects=[f.subject for f in finishes],
            bodies=[f.body for f in finishes],
            fallbacks=[
                None if f.fallback_channels is None else json.dumps(list(f.fallback_channels))
                for f in finishes
            ],
        )

    def notification_reclaim_expired(
        self, *, dead_after_s: float | None = None, limit: int = 1000
    ) -> list[Reclaimed]:
        """Takes back the claims of dead workers (no heartbeat for `dead_after_s` by the
        database's clock; None: not looked for) and the claims past their expiry, whoever
        holds them; their rows go back to PENDING, due now."""
        return SQL.rows(
            "notification_reclaim_expired",
            row=Reclaimed,
            dead_after_s=dead_after_s,
            limit=limit,
        )

    def notification_send_start(self, claims: list[Claim]) -> dict[uuid.UUID, str]:
        """The last check before the provider call, one statement for `claims`: each row still
        PROCESSING under its claim and not past its expiry is marked started ("started"), one
        past its expiry answers "expired"; a row cancelled meanwhile (or whose claim was taken
        over) is absent: it must not be sent."""
        if not claims:
            return {}
        rows = SQL.rows(
            "notification_send_start",
            row=_SendStart,
            ids=[c.id for c in claims],
            tokens=[c.claim_token for c in claims],
        )
        return {row.id: row.state for row in rows}

    def history_partitions_add(self, *, weeks_ahead: int) -> list[str]:
        """Adds the history tables' missing partitions up to `weeks_ahead` weeks ahead."""
        return SQL.scalars("history_partitions_add", weeks_ahead=weeks_ahead)

    def notifications_expire(self, *, limit: int) -> list[Expired]:
        """Ends up to `limit` waiting rows past their expiry EXPIRED; returns them."""
        return SQL.rows("notifications_expire", row=Expired, limit=limit)

    def notification_next_due_in(self) -> float | None:
        """Seconds until the next waiting row is due by the database's clock (<= 0: now)."""
        return SQL.scalar("notification_next_due_in")

    def worker_heartbeat(self, *, worker: str, hostname: str, pid: int, delivered: int) -> bool:
        """Writes the worker's row, seen now by the database's clock; returns whether its
        wake-up mark is set."""
        return SQL.scalar(
            "worker_heartbeat_upsert",
            worker=worker,
            hostname=hostname,
            pid=pid,
            delivered=delivered,
        )

    def statistics_refresh(
        self, *, changes: int, fraction: float, queue_rows: int = 0
    ) -> list[str]:
        """ANALYZEs each hot table that changed by more than `changes` rows and more than
        `fraction` of its rows since it was last analyzed, and the queue table when the
        planner counts fewer than `queue_rows` rows in it; returns their names. One worker at
        a time (a transaction-scoped advisory lock; the others skip). ANALYZE reads a
        fixed-size sample, so its cost does not grow with the table; a small one
        (`statistics_sample_small`), as this runs on the worker's loop. A table another
        holds (autovacuum working on it) is skipped, not waited for (its name is still
        returned): it stays stale, and a later check finds it again."""
        with transaction.atomic():
            if not SQL.scalar("statistics_refresh_lock"):
                return []
            stale = SQL.scalars(
                "statistics_stale_tables",
                tables=list(HOT_TABLES),
                changes=changes,
                fraction=fraction,
                queue_rows=queue_rows,
            )
            if stale:
                SQL.execute("statistics_sample_small")
            for table in stale:
                SQL.execute(f"analyze_{table}")
        return stale

    def queues_dead_and_live(self) -> dict[str, QueueRows]:
        """Each of QUEUE_TABLES's dead and live rows, as PostgreSQL's statistics count them,
        by table."""
        counted = SQL.rows("queue_dead_and_live", row=QueueRows, tables=list(QUEUE_TABLES))
        return {rows.table: rows for rows in counted}

    def queue_vacuum(self, table: str) -> None:
        """VACUUMs one of QUEUE_TABLES, or does nothing if another holds it (autovacuum,
        another worker). Outside any transaction: VACUUM cannot run in one."""
        if table not in QUEUE_TABLES:
            raise ValueError(f"not a queue table: {table}")
        SQL.execute(f"vacuum_{table}")

    def worker_stopped(self, *, worker: str, delivered: int) -> None:
        SQL.execute("worker_heartbeat_stop", worker=worker, delivered=delivered)

    def worker_waiting_mark(self, *, worker: str) -> None:
        """From its commit on, creates notify (the wake-up trigger); a create whose wake-up trigger
        ran before is committed by then, so a claim made after this sees its row."""
        SQL.execute("worker_waiting_mark", worker=worker)

    def worker_waiting_clear(self, *, worker: str) -> None:
        SQL.execute("worker_waiting_clear", worker=worker)

    def worker_waiting_clear_stale(self, *, seconds: float) -> int:
        """Clears the wake-up marks of workers not seen for `seconds`; how many."""
        return SQL.execute("worker_waiting_clear_stale", seconds=seconds)

    def simulated_messages_call(
        self,
        calls: list[tuple[str, str, str]],
        decide: Callable[[int, str], tuple[str | None, str | None]],
    ) -> dict[str, SimulatedCall]:
        """Records calls to the simulated provider, one (key, channel, recipient) each: a key
        with a final answer gets it again; otherwise `decide(calls, recipient)` answers, and a
        final answer is settled once. A key seen for the first time is inserted with its first
        call's answer, so the common case is one statement for the whole batch; keys called
        before without a final answer take a second (a third when another worker settled one
        meanwhile): autocommit, keys in one order, and the guarded UPDATE makes a race
        harmless. A key repeated in `calls` is one call."""
        unique = {key: (key, channel, recipient) for key, channel, recipient in calls}
        keys, channels, recipients = (list(column) for column in zip(*unique.values(), strict=True))
        first = [decide(1, recipient) for recipient in recipients]
        counted = {
            call.idempotency_key: SimulatedCall(call.calls, call.outcome, call.message_id)
            for call in SQL.rows(
                "simulated_messages_call",
                row=_SimulatedCallRow,
                keys=keys,
                channels=channels,
                recipients=recipients,
                outcomes=[outcome for outcome, _ in first],
                message_ids=[message_id for _, message_id in first],
            )
        }
        answers = {}
        for key, call in counted.items():
            if call.outcome is None and call.calls > 1:
                outcome, message_id = decide(call.calls, unique[key][2])
                if outcome is not None:
                    answers[key] = (outcome, message_id)
        if answers:
            settled = {
                answer.idempotency_key: (answer.outcome, answer.message_id)
                for answer in SQL.rows(
                    "simulated_messages_answer",
                    row=_SimulatedAnswer,
                    keys=list(answers),
                    outcomes=[outcome for outcome, _ in answers.values()],
                    message_ids=[message_id for _, message_id in answers.values()],
                )
            }
            if raced := [key for key in answers if key not in settled]:
                rows = SQL.rows("simulated_messages_get", row=_SimulatedAnswer, keys=raced)
                settled |= {
                    answer.idempotency_key: (answer.outcome, answer.message_id) for answer in rows
                }
            for key, (outcome, message_id) in settled.items():
                counted[key] = SimulatedCall(counted[key].calls, outcome, message_id)
        return counted


def _text(value: str | None) -> str | None:
    """PostgreSQL text cannot hold NUL; a provider's answer may. Anything else is kept."""
    return None if value is None else value.replace("\x00", "\ufffd")


@dataclass(frozen=True)
class AttemptRecord:
    number: int
    channel: str
    worker: str
    started_at: datetime
    finished_at: datetime | None
    outcome: str | None
    error: str | None
    provider_message_id: str | None


def notification_attempts(
    *, notification_id: uuid.UUID, client_id: uuid.UUID | None
) -> list[AttemptRecord] | None:
    """Every attempt at a notification, oldest first; None when the notification does not
    exist or belongs to another client (`client_id=None` means an operator: any client)."""
    from delivery.models import DeliveryAttempt
    from notifications.models import Notification

    visible = Notification.objects.filter(id=notification_id)
    if client_id is not None:
        visible = visible.filter(client_id=client_id)
    if not visible.exists():
        return None
    rows = DeliveryAttempt.objects.filter(notification_id=notification_id).order_by(
        "started_at", "id"
    )
    return [
        AttemptRecord(
            number=a.number,
            channel=a.channel,
            worker=a.worker,
            started_at=a.started_at,
            finished_at=a.finished_at,
            outcome=a.outcome,
            error=a.error,
            provider_message_id=a.provider_message_id,
        )
        for a in rows
    ]


# Retention (delivery/retention.py): deleting finished notifications with every row, in every
# app, that refers to them.
RETENTION_SQL = Queries(Path(__file__).with_name("sql") / "retention.sql")


@dataclass(frozen=True)
class PruneStep:
    """What one retention batch did; `position` is where the next batch starts."""

    scanned: int
    deleted: int
    attempts_deleted: int
    position: ListPosition | None


@dataclass(frozen=True)
class _PruneBatchRow:
    """notifications_prune_batch's row; `last_*` is the last row scanned (None if none)."""

    scanned: int
    deleted: int
    attempts_deleted: int
    last_created_at: datetime | None
    last_id: uuid.UUID | None


@dataclass(frozen=True)
class HistoryWeek:
    """A week's partition of `notification` (history_partition_add): its name and id range."""

    name: str
    lo: uuid.UUID
    hi: uuid.UUID


@dataclass(frozen=True)
class WeekPruneStep:
    """What one batch of a week's retention did; `last_id` is where the next one starts
    (None: the week has no row left to walk)."""

    scanned: int
    attempts_deleted: int
    last_id: uuid.UUID | None


# Where a retention run starts: before any row.
PRUNE_START = ListPosition(created_at=datetime.min.replace(tzinfo=UTC), id=uuid.UUID(int=0))


class RetentionRepository:
    def prune_cutoff(self, *, older_than_s: float) -> datetime:
        """The database clock now, minus `older_than_s`."""
        return RETENTION_SQL.scalar("notifications_prune_cutoff", older_than_s=older_than_s)

    def prune_digests(self, *, cutoff: datetime, limit: int) -> int:
        """Deletes up to `limit` digest buckets closed before `cutoff`; returns how many."""
        return RETENTION_SQL.execute("digests_prune_batch", cutoff=cutoff, limit=limit)

    def history_weeks_before(self, *, cutoff: datetime) -> list[HistoryWeek]:
        """The weeks of `notification` that ended by `cutoff`, oldest first."""
        return RETENTION_SQL.rows("history_weeks_before", row=HistoryWeek, cutoff=cutoff)

    def history_week_held(self, week: HistoryWeek) -> bool:
        """Whether a row of the week still waits, or still has a webhook to deliver."""
        return RETENTION_SQL.scalar("history_week_held", lo=week.lo, hi=week.hi)

    def history_week_prune_batch(
        self, week: HistoryWeek, *, after: uuid.UUID, scan: int
    ) -> WeekPruneStep:
        """Deletes the other history of the week's next `scan` notifications after `after`."""
        return RETENTION_SQL.row(
            "history_week_prune_batch",
            row=WeekPruneStep,
            lo=week.lo,
            hi=week.hi,
            after=after,
            scan=scan,
            channels=list(Channel.values),
        )

    def notification_week_drop(self, week: HistoryWeek) -> bool:
        """Drops the week's partition, unless a row of it waits again; whether it went."""
        return RETENTION_SQL.scalar("notification_week_drop", name=week.name)

    def prune_batch(self, *, cutoff: datetime, after: ListPosition, scan: int) -> PruneStep:
        """Deletes finished rows among the next `scan` rows created before `cutoff`."""
        done = RETENTION_SQL.row(
            "notifications_prune_batch",
            row=_PruneBatchRow,
            cutoff=cutoff,
            after_created_at=after.created_at,
            after_id=after.id,
            scan=scan,
            channels=list(Channel.values),
        )
        position = (
            None
            if done.last_id is None
            else ListPosition(created_at=done.last_created_at, id=done.last_id)
        )
        return PruneStep(
            scanned=done.scanned,
            deleted=done.deleted,
            attempts_deleted=done.attempts_deleted,
            position=position,
        )
