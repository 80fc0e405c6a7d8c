"""The delivery worker's database upkeep: one service per job, each with a `run_once()` that
does it once and returns what it did. The worker's loop (delivery/worker.py) calls each on
its own interval; nothing here decides when.

- `Heartbeat`: the worker's evidence of life, its row, written from a thread of its own; and
  the wake-up marks of workers not seen for a while;
- `ClaimReclaimer`: the claims of dead workers, and claims past their timeout, back to the
  queue;
- `ExpiryFinisher`: waiting notifications past their `expires_at` ended EXPIRED, a bounded
  batch at a time;
- `HistoryPartitions`: the history tables' weekly partitions, added weeks ahead;
- `WindowPruner`: rate-window rows that left every window, a bounded statement at a time;
- `StatisticsRefresher`: ANALYZE of a hot table whose statistics fell behind;
- `QueueVacuumer`: VACUUM of a queue table a drain left full of dead rows;
- `ReceiptUpkeep`: pending receipts whose attempt is now recorded applied (a page a turn),
  pending ones too old to match and replay-guard ids past their use deleted.

Invariants: every decision about time is the database's (the statements read
notifyqueue_now()); the refresher and the vacuumer are only optimisations, so their errors are
logged and never stop the worker; the heartbeat and the vacuum run on threads with
connections of their own, one of each a worker; a worker sends no claim it may have lost
(`Heartbeat.holds`).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable

from django.db import DatabaseError, connection

from delivery.receipts.repositories import PendingPosition
from delivery.receipts.services import receipts_prune, receipts_sweep
from delivery.repositories import DeliveryRepository, QueueRows
from monitoring import metrics
from notifyqueue.history import WEEKS_AHEAD
from notifyqueue.outage import OutageLog
from ratelimits.repositories import RateLimitRepository

log = logging.getLogger("notifyqueue.delivery")

# A hot table changed by more rows than this, and than this fraction of its rows, since its
# last ANALYZE is analyzed at the next check (see StatisticsRefresher), which a running worker
# makes every STATISTICS_CHECK_S: a burst into a queue whose statistics say it is empty is
# claimed with plans that sort the whole burst on every claim until then (17-19 ms a claim of
# 100 at 9,000 waiting), and a burst of tens of thousands drains in a few seconds.
STATISTICS_STALE_ROWS = 2_000
STATISTICS_STALE_FRACTION = 0.01
STATISTICS_CHECK_S = 1.0
# A finished row leaves its queue table, but its index entries stay until VACUUM removes them,
# and every claim steps over them: after a drain of 40,000 rows a claim of one row visited 470
# pages of queue_pending_client instead of 4, the webhook sender's after 20,000 deliveries 923
# of webhook_queue instead of 17. Autovacuum comes round within its naptime (a minute by
# default), later while its workers are busy with the large tables. A dry worker (nothing due)
# that finds more dead rows in a queue table than this, and more dead than live, vacuums it
# itself at that check, from a thread of its own (see QueueVacuumer).
QUEUE_VACUUM_DEAD_ROWS = 10_000
# After a VACUUM that left most of the dead rows (another's pass held the queue, or the role may
# not vacuum it: only the tables' owner may), the worker waits this long before trying again.
QUEUE_VACUUM_RETRY_S = 60.0
# How often a worker makes sure the history tables' coming weeks have their partitions.
HISTORY_PARTITIONS_S = 3600.0
# A worker not seen for this many heartbeats (and this long) is taken for dead: its wake-up
# mark is cleared (see Heartbeat).
WAITING_STALE_HEARTBEATS = 3
WAITING_STALE_MIN_S = 60.0
# A beat that failed (a lost connection, a restarted server) is tried again this soon, on a
# new connection, rather than a whole heartbeat later.
HEARTBEAT_RETRY_S = 0.5


class Heartbeat:
    """The worker's evidence of life: its worker_heartbeat row, seen now by the database's
    clock, written every `interval_s` by a thread with a database connection of its own
    (`start`), so a slow step of the loop never makes a live worker look dead. Another worker
    takes over the claims of one whose row is older than `dead_after_s` (worker_dead,
    notification_reclaim_expired), so the worker holds a claim only while its beats keep
    arriving: `holds(claimed_at)` says whether a claim made at that time (time.monotonic()) is
    surely still its own, and a claim that is not is never sent (see `holds`)."""

    def __init__(
        self,
        *,
        repository: DeliveryRepository,
        worker_id: str,
        interval_s: float,
        dead_after_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.repository = repository
        self.worker_id = worker_id
        self.interval_s = interval_s
        self.dead_after_s = dead_after_s
        # The worker's own clock (time.monotonic()): only measures how long since a beat.
        self.clock = clock
        # Set when a beat finds the worker's wake-up mark cleared while the loop wants it (it
        # was taken for dead): the loop marks itself again (Worker._maintain).
        self.mark_lost = threading.Event()
        self._lock = threading.Lock()
        # Until the first beat nothing vouches for the worker, and nothing takes its claims
        # for want of one: every claim is its own.
        self._alive_until = math.inf
        self._alive_since = -math.inf
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # A database outage is logged once, however many beats it fails.
        self._outage = OutageLog(log, f"heartbeat worker={worker_id}")

    def run_once(self, *, delivered: int, waiting: bool) -> int:
        """One beat: writes the worker's row, notes whether its wake-up mark was lost (the
        loop wants it, `waiting`, and it is gone), and clears the marks of workers not seen
        for WAITING_STALE_HEARTBEATS heartbeats (at least WAITING_STALE_MIN_S): a worker
        killed outright leaves its mark behind, and the creates would notify for it for
        ever. Returns how many marks were cleared."""
        started = self.clock()
        marked = self.repository.worker_heartbeat(
            worker=self.worker_id,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            delivered=delivered,
        )
        self._seen(started)
        if waiting and not marked:
            self.mark_lost.set()
        return self.repository.worker_waiting_clear_stale(
            seconds=max(WAITING_STALE_HEARTBEATS * self.interval_s, WAITING_STALE_MIN_S)
        )

    def _seen(self, started: float) -> None:
        """A beat sent at `started` was written: the database takes the worker for alive
        until `dead_after_s` after it, and the worker trusts its claims until a heartbeat
        interval before that. A beat after that moment ends a lapse: every claim made before
        it may have been taken over meanwhile."""
        if self.dead_after_s is None:
            return
        with self._lock:
            if started >= self._alive_until:
                self._alive_since = started
            self._alive_until = started + self.dead_after_s - self.interval_s

    def alive(self) -> bool:
        """Whether the database surely still takes the worker for alive: claim only then."""
        with self._lock:
            return self.clock() < self._alive_until

    def holds(self, claimed_at: float) -> bool:
        """Whether a claim made at `claimed_at` (time.monotonic(), taken before the claim
        statement) is surely still this worker's: its beats have kept arriving since, close
        enough together that no other worker can have taken it for dead. A worker frozen
        (SIGSTOP) or cut off from the database past that point sends none of the claims it
        made before: another may have taken them over and sent them."""
        with self._lock:
            return self.clock() < self._alive_until and claimed_at >= self._alive_since

    def start(self, *, state: Callable[[], tuple[int, bool]]) -> None:
        """Beats once on the calling thread (raising what the database raises), then every
        `interval_s` on a thread of its own; `state()` gives each beat the worker's delivered
        count and whether its loop wants its wake-up mark."""
        delivered, waiting = state()
        self.run_once(delivered=delivered, waiting=waiting)
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._beat, args=(state,), name="heartbeat", daemon=True
        )
        self._thread.start()

    def stop(self, *, timeout: float = 10.0) -> None:
        """Ends the beats (the worker is about to write that it stopped)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)
            self._thread = None

    def _beat(self, state: Callable[[], tuple[int, bool]]) -> None:
        next_at = time.monotonic() + self.interval_s
        try:
            while not self._stop.wait(max(0.0, next_at - time.monotonic())):
                next_at = time.monotonic() + self.interval_s
                try:
                    delivered, waiting = state()
                    self.run_once(delivered=delivered, waiting=waiting)
                except Exception:
                    # Never fatal: a thread that died would leave a live worker looking dead.
                    # A lost connection is opened again at the next try, soon.
                    retry_s = min(self.interval_s, HEARTBEAT_RETRY_S)
                    self._outage.failed(retry_s)
                    connection.close()
                    next_at = time.monotonic() + retry_s
                else:
                    self._outage.succeeded()
        finally:
            connection.close()  # this thread's own


class ClaimReclaimer:
    def __init__(
        self,
        *,
        repository: DeliveryRepository,
        worker_id: str,
        dead_after_s: float | None = None,
    ) -> None:
        self.repository = repository
        self.worker_id = worker_id
        self.dead_after_s = dead_after_s

    def run_once(self) -> int:
        """Takes back the claims of dead workers (no heartbeat for `dead_after_s`, by the
        database's clock) and the claims past their claim timeout; their rows go back to the
        queue. Returns how many; counts them by cause."""
        reclaimed = self.repository.notification_reclaim_expired(dead_after_s=self.dead_after_s)
        causes: Counter[str] = Counter()
        for row in reclaimed:
            causes[row.cause] += 1
            log.warning(
                "claim taken back notification=%s cause=%s status=%s worker=%s",
                row.id,
                row.cause,
                row.status,
                self.worker_id,
            )
        for cause, count in causes.items():
            metrics.claim_rescued(kind="notification", cause=cause, count=count)
        return len(reclaimed)


class ExpiryFinisher:
    """Ends waiting notifications past their expiry EXPIRED, at most `batch` a statement
    (`notifications_expire`, read through the queue's partial index of waiting rows with an
    expiry, so a statement costs the rows it ends, not the backlog). Runs at each heartbeat
    and, while its last batch came back full (`due`), at every turn of the loop."""

    def __init__(self, *, repository: DeliveryRepository, worker_id: str, batch: int) -> None:
        self.repository = repository
        self.worker_id = worker_id
        self.batch = batch
        self.due = False

    def run_once(self) -> int:
        """One statement; returns how many notifications it ended EXPIRED."""
        expired = self.repository.notifications_expire(limit=self.batch)
        self.due = len(expired) >= self.batch
        by_channel: dict[str, int] = {}
        for row in expired:
            by_channel[row.channel] = by_channel.get(row.channel, 0) + 1
            log.debug(
                "expired notification=%s client=%s channel=%s outcome=EXPIRED status=EXPIRED "
                "worker=%s",
                row.id,
                row.client_id,
                row.channel,
                self.worker_id,
            )
        for channel, count in by_channel.items():
            metrics.notifications_expired(channel=channel, count=count)
        if expired:
            log.info("expired notifications=%d worker=%s", len(expired), self.worker_id)
        return len(expired)


class HistoryPartitions:
    """Adds the history tables' weekly partitions ahead of time: this week's and the next
    WEEKS_AHEAD (history_partition_add, which any rows of those weeks in the default
    partition move into). Runs when the worker starts and every HISTORY_PARTITIONS_S. A week's
    partition is there weeks before its rows, so a turn that fails (a lock not had in time) is
    logged and changes nothing: the next one adds it."""

    def __init__(self, *, repository: DeliveryRepository, worker_id: str) -> None:
        self.repository = repository
        self.worker_id = worker_id

    def run_once(self) -> list[str]:
        """Returns the partitions it added."""
        try:
            added = self.repository.history_partitions_add(weeks_ahead=WEEKS_AHEAD)
        except DatabaseError as exc:
            log.warning("history partitions not added worker=%s error=%s", self.worker_id, exc)
            return []
        if added:
            log.info("history partitions added=%s worker=%s", ",".join(added), self.worker_id)
        return added


class WindowPruner:
    """Deletes rate-window rows that left every window, at most `batch` a statement. Runs at
    each heartbeat and, in the loop, whenever the worker has admitted another `batch`
    deliveries since (`admitted`, counted by the rate-limit stage; `due`): rows leave the
    window at the rate they were admitted a window ago, so the prune keeps pace with the
    deliveries one bounded statement at a time (one a heartbeat fell behind above `batch` /
    heartbeat_s = 2,000 deliveries a second a worker)."""

    def __init__(self, *, repository: RateLimitRepository, window_s: float, batch: int) -> None:
        self.repository = repository
        self.window_s = window_s
        self.batch = batch
        # Deliveries admitted since the last prune.
        self.admitted = 0

    @property
    def due(self) -> bool:
        return self.admitted >= self.batch

    def run_once(self) -> int:
        """One statement; returns how many window rows it deleted."""
        pruned = self.repository.ratelimit_prune(window_s=self.window_s, limit=self.batch)
        # Counted off once done: a prune the database refused is run again at the next turn.
        self.admitted = max(0, self.admitted - self.batch)
        return pruned


class StatisticsRefresher:
    def __init__(self, *, repository: DeliveryRepository, worker_id: str) -> None:
        self.repository = repository
        self.worker_id = worker_id

    def run_once(self, *, queue_rows: int = 0) -> list[str]:
        """Keeps the planner's picture of the hot tables within STATISTICS_STALE_ROWS changes
        (and STATISTICS_STALE_FRACTION of the table) of the truth, and the queue's row count
        at least `queue_rows` (what a claim just took from it), so a burst of due rows does
        not make every claim read the whole backlog until autoanalyze comes round. Returns
        the tables analyzed. Only an optimisation: errors are logged."""
        try:
            refreshed = self.repository.statistics_refresh(
                changes=STATISTICS_STALE_ROWS,
                fraction=STATISTICS_STALE_FRACTION,
                queue_rows=queue_rows,
            )
        except DatabaseError:
            log.exception("statistics not refreshed worker=%s", self.worker_id)
            return []
        if refreshed:
            tables = ",".join(refreshed)
            log.info("statistics refreshed tables=%s worker=%s", tables, self.worker_id)
        return refreshed


class QueueVacuumer:
    def __init__(self, *, repository: DeliveryRepository, worker_id: str) -> None:
        self.repository = repository
        self.worker_id = worker_id
        # The thread vacuuming, while it runs.
        self.thread: threading.Thread | None = None
        self._not_before = 0.0

    def run_once(self) -> threading.Thread | None:
        """Starts a VACUUM of each queue table (QUEUE_TABLES: the notifications' and the
        webhook events') that holds more than QUEUE_VACUUM_DEAD_ROWS dead rows and more dead
        than live, what a drained burst leaves; the worker calls it once it found nothing due.
        The VACUUMs run one after the other in a thread with a database connection of its own,
        closed when it ends, so the loop goes on claiming; one such thread at a time a worker,
        and across workers and autovacuum one pass on a table at a time too (each skips a
        table another is vacuuming). A pass that left most of a table's dead rows keeps the
        worker from trying again for QUEUE_VACUUM_RETRY_S. Returns the thread, or None. Only
        an optimisation: errors are logged."""
        if self.thread is not None and self.thread.is_alive():
            return None
        if time.monotonic() < self._not_before:
            return None
        try:
            counted = self.repository.queues_dead_and_live()
        except DatabaseError:
            log.exception("queue's dead rows not counted worker=%s", self.worker_id)
            return None
        dead = [
            rows for rows in counted.values() if rows.dead > max(QUEUE_VACUUM_DEAD_ROWS, rows.live)
        ]
        if not dead:
            return None
        self.thread = threading.Thread(
            target=self._vacuum, args=(dead,), name="queue-vacuum", daemon=True
        )
        self.thread.start()
        return self.thread

    def join(self, *, timeout: float) -> None:
        if self.thread is not None:
            self.thread.join(timeout=timeout)

    def _vacuum(self, queues: list[QueueRows]) -> None:
        try:
            for before in queues:
                started = time.monotonic()
                self.repository.queue_vacuum(before.table)
                # Counted again: a VACUUM that found the table held by another's did nothing.
                after = self.repository.queues_dead_and_live()[before.table]
                if after.dead > before.dead // 2:
                    self._not_before = time.monotonic() + QUEUE_VACUUM_RETRY_S
                log.info(
                    "queue vacuum table=%s dead=%d dead_after=%d live=%d seconds=%.2f worker=%s",
                    before.table,
                    before.dead,
                    after.dead,
                    after.live,
                    time.monotonic() - started,
                    self.worker_id,
                )
        except DatabaseError:
            log.exception("queue not vacuumed worker=%s", self.worker_id)
            self._not_before = time.monotonic() + QUEUE_VACUUM_RETRY_S
        finally:
            connection.close()  # this thread's own


class ReceiptUpkeep:
    """The receipts' safety net and their bound. A receipt that arrived before its attempt's
    result is applied by the arrival or by the finish (delivery.receipts.services); a process
    that died between its commit and its second look leaves it pending, and this sweep
    applies it, a page of pending receipts a turn, round the whole set. Pending receipts older
    than `pending_age_s` and replay-guard ids older than `seen_age_s` are deleted, a bounded
    statement each turn."""

    PAGE = 500
    PRUNE_BATCH = 5_000

    def __init__(self, *, pending_age_s: float, seen_age_s: float) -> None:
        self.pending_age_s = pending_age_s
        self.seen_age_s = seen_age_s
        self._after: PendingPosition | None = None

    def run_once(self) -> tuple[int, int]:
        """(receipts applied, rows pruned); errors are logged: the next turn tries again."""
        try:
            applied, self._after = receipts_sweep(after=self._after, limit=self.PAGE)
            pruned = receipts_prune(
                pending_age_s=self.pending_age_s,
                seen_age_s=self.seen_age_s,
                limit=self.PRUNE_BATCH,
            )
        except DatabaseError:
            log.exception("receipt upkeep failed; trying again at the next turn")
            return 0, 0
        if applied or pruned:
            log.info("receipt upkeep applied=%d pruned=%d", applied, pruned)
        return applied, pruned
