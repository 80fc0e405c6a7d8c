"""The notification record, and the narrow queue table that indexes it by status and due time.

Invariants held by the database itself (see docs/technical-design.md):
- one row per (client, idempotency_key), across every weekly partition of the table: each
  partition's unique index, and the trigger notification_key_unique across them;
- status, channel and priority take only their listed values, and the attempt and retry counts
  are never negative (each a domain's rule, `DomainColumn`);
- a PROCESSING row always names its claim (token, worker, expiry), and no other row does;
- attempt_count stays within 0..max_attempts + 1 (the one extra is the crash re-check).
"""

import uuid

from django.db import models
from django.db.models import F, Q
from django.db.models.expressions import Combinable
from django.db.models.functions import MD5, Cast

from notifyqueue.history import uuid7
from notifyqueue.vocabulary import RECIPIENT_MAX_LENGTH, Channel, Priority


def recipient_digest(recipient: str | Combinable) -> Cast:
    """`md5(recipient)::uuid`: the recipient indexes' key, 16 bytes whatever the recipient's
    length (a push token may be 4,096 characters, longer than a btree entry allows). SQL
    written by hand spells the same expression, so the planner matches it to the index."""
    value = recipient if isinstance(recipient, Combinable) else models.Value(recipient)
    return Cast(MD5(value), output_field=models.UUIDField())


def recipient_is(recipient: str) -> Q:
    """Rows for exactly this recipient, found through its digest's index."""
    digest_matches = models.lookups.Exact(
        recipient_digest(F("recipient")), recipient_digest(recipient)
    )
    return Q(digest_matches, recipient=recipient)


class DomainColumn:
    """A field whose column type is a PostgreSQL domain over the field's own type, the domain
    holding the column's rule as its CHECK (its migration), so the field adds no CHECK of its
    own. PostgreSQL reads a domain's rule once per connection; a table's CHECKs it reads again,
    from their stored text, for every statement that writes the table (a fifth of a create's
    work in PostgreSQL)."""

    def __init__(self, *args, domain: str, **kwargs) -> None:
        self.domain = domain
        super().__init__(*args, **kwargs)

    def deconstruct(self):
        name, path, args, kwargs = super().deconstruct()
        return name, path, args, {**kwargs, "domain": self.domain}

    def db_type(self, connection) -> str:
        return self.domain

    def db_check(self, connection) -> None:
        return None


class DomainCharField(DomainColumn, models.CharField):
    pass


class DomainSmallIntegerField(DomainColumn, models.SmallIntegerField):
    pass


class DomainPositiveIntegerField(DomainColumn, models.PositiveIntegerField):
    pass


class Status(models.TextChoices):
    PENDING = "PENDING"
    PROCESSING = "PROCESSING"
    SENT = "SENT"
    FAILED = "FAILED"
    DEAD_LETTERED = "DEAD_LETTERED"
    CANCELLED = "CANCELLED"
    SUPPRESSED = "SUPPRESSED"
    # Not sent by its `expires_at`: final, never sent afterwards.
    EXPIRED = "EXPIRED"
    # Collected into a digest (`digest_id` names the notification that carried it): final.
    DIGESTED = "DIGESTED"


class HeldReason(models.TextChoices):
    """Why a PENDING notification waits past its own due time (the representation's
    `held_reason`, with `held_until`)."""

    RATE_LIMIT = "rate_limit"  # its recipient's rate limit deferred it to a free slot
    CIRCUIT_OPEN = "circuit_open"  # its provider's circuit was open: the provider's probe time
    QUIET_HOURS = "quiet_hours"  # its user's quiet hours: the window's end, in the user's time
    DIGEST = "digest"  # collected into a digest bucket: the bucket's close time


def held_reason_of(
    *,
    status: str,
    rate_deferred_from: object | None,
    circuit_held_since: object | None,
    quiet_held_since: object | None = None,
    digest_bucket_id: object | None = None,
) -> str | None:
    """Why a row waits past its own time: only a PENDING row is held, by a digest bucket
    that collected it (digest_bucket_id set: it waits for the bucket's close and is never
    claimed itself), a rate-limit deferral (rate_deferred_from set), its provider's open
    circuit (circuit_held_since set) or its user's quiet hours (quiet_held_since set). Each
    hold clears the others' marks."""
    if status != Status.PENDING:
        return None
    if digest_bucket_id is not None:
        return HeldReason.DIGEST.value
    if rate_deferred_from is not None:
        return HeldReason.RATE_LIMIT.value
    if circuit_held_since is not None:
        return HeldReason.CIRCUIT_OPEN.value
    if quiet_held_since is not None:
        return HeldReason.QUIET_HOURS.value
    return None


FINAL_STATUSES = frozenset(
    {
        Status.SENT,
        Status.FAILED,
        Status.DEAD_LETTERED,
        Status.CANCELLED,
        Status.SUPPRESSED,
        Status.EXPIRED,
        Status.DIGESTED,
    }
)


def cancellation_digest(key: str | Combinable) -> Cast:
    """`md5(cancellation_key)::uuid`: the queue's key for a cancellation key (up to 255
    characters), 16 bytes in an index whatever its length. SQL spells the same expression."""
    value = key if isinstance(key, Combinable) else models.Value(key)
    return Cast(MD5(value), output_field=models.UUIDField())


class Notification(models.Model):
    """The record of a notification. The table is partitioned by week of creation, read from
    the UUIDv7 id (notifyqueue/history.py): retention drops whole weeks."""

    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    # No index of its own: every lookup by client is served by a composite index below.
    client = models.ForeignKey(
        "clients.Client", on_delete=models.PROTECT, related_name="+", db_index=False
    )
    idempotency_key = models.CharField(max_length=255)
    # sha256 of the canonical request, to tell a replay (200) from a reused key (409).
    request_fingerprint = models.CharField(max_length=64)

    channel = DomainCharField(max_length=16, choices=Channel.choices, domain="notification_channel")
    recipient = models.CharField(max_length=RECIPIENT_MAX_LENGTH)
    subject = models.TextField(blank=True, default="")
    body = models.TextField()
    priority = DomainSmallIntegerField(
        choices=Priority.choices, default=Priority.NORMAL, domain="notification_priority"
    )
    metadata = models.JSONField(default=dict, blank=True)
    user_id = models.CharField(max_length=255, null=True, blank=True)
    template = models.CharField(max_length=255, null=True, blank=True)
    payload = models.JSONField(null=True, blank=True)
    fallback_channels = models.JSONField(default=list, blank=True)

    status = DomainCharField(
        max_length=16, choices=Status.choices, default=Status.PENDING, domain="notification_status"
    )
    # send_at is what the client asked for; due_at is when the queue may next claim the row
    # (moved forward by backoff and rate-limit deferrals).
    send_at = models.DateTimeField()
    due_at = models.DateTimeField()
    # Set while a rate-limit deferral holds the row later than it would otherwise go: the due
    # time it had before (its send_at or retry backoff). A freed slot may move the row forward
    # again, never earlier than this.
    rate_deferred_from = models.DateTimeField(null=True, blank=True)
    # Set while the row is held because its provider's circuit was open when it was claimed
    # (the provider was never asked, so no attempt was spent): when the hold began. Kept across
    # the holds of one outage, so that NOTIFYQUEUE_CIRCUIT_MAX_HOLD_SECONDS counts from the
    # first; cleared by the next attempt's result or the dead-lettering at the maximum hold.
    circuit_held_since = models.DateTimeField(null=True, blank=True)
    # Set while the row is held by its user's quiet hours (the send-time stage found it inside
    # a window, so it gave the attempt back): when the hold began. Cleared when the row next
    # passes the stage, or when a change of the user's time zone or windows lets it go.
    quiet_held_since = models.DateTimeField(null=True, blank=True)
    attempt_count = DomainPositiveIntegerField(default=0, domain="notification_count")
    max_attempts = DomainPositiveIntegerField(domain="notification_count")
    last_error = models.TextField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    # The provider's latest delivery receipt's type (delivery.receipts); a bounce or a
    # complaint is never overwritten. Null until one arrives.
    receipt = models.CharField(max_length=16, null=True, blank=True)
    operator_retries = DomainPositiveIntegerField(default=0, domain="notification_count")
    # The latest operator retry: when, and who ("admin:<user>", "api:<client>", "cli:<user>").
    last_retried_at = models.DateTimeField(null=True, blank=True)
    last_retried_by = models.CharField(max_length=255, null=True, blank=True)

    claim_token = models.UUIDField(null=True, blank=True)
    claimed_by = models.CharField(max_length=200, null=True, blank=True)
    claim_expires_at = models.DateTimeField(null=True, blank=True)
    # Set by the worker's last check before the provider call (`notification_send_start_many`),
    # in the statement that finds the row still PROCESSING under its claim and not expired;
    # cleared by the next claim. A cancel by key takes only claimed rows where it is NULL: the
    # two meet on the row lock, so a send either started before the cancel (and finishes) or
    # never starts.
    send_started_at = models.DateTimeField(null=True, blank=True)
    # Not sent by then (database clock), the row ends EXPIRED. Never changed after the create.
    expires_at = models.DateTimeField(null=True, blank=True)
    # The client's key for cancelling a group of notifications at once (POST
    # /notifications/cancel); found through the queue's `queue_cancellable`.
    cancellation_key = models.CharField(max_length=255, null=True, blank=True)
    # Set when a create collected the row into a digest bucket (NotificationDigest) instead of
    # queueing it: the bucket, and its close time (the row's `held_until`). Both never change
    # after the insert. Such a row waits PENDING at DIGEST_HELD_DUE_AT, never claimed itself,
    # until the bucket's close ends it DIGESTED (or a cancel or its expiry ends it first).
    digest_bucket_id = models.UUIDField(null=True, blank=True)
    digest_closes_at = models.DateTimeField(null=True, blank=True)
    # A DIGESTED row's digest: the notification that carried it.
    digest_id = models.UUIDField(null=True, blank=True)

    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "notification"
        permissions = [
            ("retry_notification", "Can retry failed and dead-lettered notifications"),
            ("cancel_notification", "Can cancel pending notifications"),
        ]
        constraints = [
            # The rules that name one column are their domains' (`DomainColumn`).
            models.CheckConstraint(
                condition=(
                    Q(
                        status=Status.PROCESSING,
                        claim_token__isnull=False,
                        claimed_by__isnull=False,
                        claim_expires_at__isnull=False,
                    )
                    | (
                        ~Q(status=Status.PROCESSING)
                        & Q(claim_token__isnull=True, claim_expires_at__isnull=True)
                    )
                ),
                name="notification_claim_iff_processing",
            ),
            models.CheckConstraint(
                condition=Q(attempt_count__lte=models.F("max_attempts") + 1),
                name="notification_attempts_bounded",
            ),
        ]
        indexes = [
            # None of these names a column that a claim, a finish or a retry changes (status,
            # due time, claim, attempts), so those updates are HOT when the page has room
            # (fillfactor 50): they write no index entry of this wide table.
            # Only the rarer updates are not: a fallback to another channel (a new recipient),
            # a rate-limit deferral (rate_deferred_from), a circuit hold and the result
            # that ends it (circuit_held_since), and a quiet-hours hold and the claim that
            # passes it (quiet_held_since). Every look-up by status or due time reads
            # NotificationQueue instead.
            # A client's listing, newest first.
            models.Index(fields=["client", "-created_at", "-id"], name="notification_client_list"),
            # An operator's listing across every client, newest first.
            models.Index(fields=["-created_at", "-id"], name="notification_recent"),
            # Rows by recipient: the list's `recipient=` filter (a client's page comes off
            # the index in order) and the admin's search (a deferral finds a key's waiting
            # rows through the queue's queue_pending_recipient). A btree keyed by the
            # recipient's digest, never by the recipient: a btree
            # entry must fit in ~2.7 kB, and a hash index on `recipient` walks every page of
            # a recipient's bucket on each insert, so a create for a recipient with 300,000
            # rows cost 67 µs more than for a new one.
            models.Index(
                recipient_digest(F("recipient")),
                F("client"),
                F("created_at").desc(),
                F("id").desc(),
                name="notification_recipient",
            ),
            # The rows a rate-limit deferral holds back, by recipient: what a freed slot lets
            # forward (ratelimit_release_next, run for most admissions). Tiny, so its cost
            # does not grow with the backlog, and it gives the function's cached generic plan
            # a cheap path; without it the plan cache re-planned the look-up on every call.
            models.Index(
                recipient_digest(F("recipient")),
                name="notification_rate_held",
                condition=Q(rate_deferred_from__isnull=False),
            ),
            # The rows an open circuit holds, by channel: what the circuit's closing lets go
            # at once (notification_circuit_release) instead of at their held_until. Only
            # held rows have an entry, so the release costs the held rows, not the backlog.
            models.Index(
                fields=["channel"],
                name="notification_circuit_held",
                condition=Q(circuit_held_since__isnull=False),
            ),
            # The rows a user's quiet hours hold, by (client, user): what a change of the
            # user's time zone or windows re-times (the trigger
            # user_preferences_quiet_hours_changed), and what /metrics counts. Only held rows
            # have an entry, so that costs the user's held rows, not the backlog.
            models.Index(
                fields=["client", "user_id"],
                name="notification_quiet_held",
                condition=Q(quiet_held_since__isnull=False),
            ),
            # The admin's search and filter by cancellation key, across every client; only
            # rows that carry one have an entry, and the key never changes, so no claim or
            # finish writes here. (A client's cancel reads the queue's queue_cancellable.)
            models.Index(
                fields=["cancellation_key"],
                name="notification_cancellation_key",
                condition=Q(cancellation_key__isnull=False),
            ),
            # A digest bucket's rows in id order: what the close walks, a bounded batch at a
            # time (`notification_digest_collect`). Only collected rows have an entry, and
            # neither column ever changes, so no claim or finish writes here.
            models.Index(
                fields=["digest_bucket_id", "id"],
                name="notification_digest_items",
                condition=Q(digest_bucket_id__isnull=False),
            ),
            # The admin's search by idempotency key across every client (the unique index
            # leads with client_id, so it cannot serve a search without one).
            models.Index(fields=["idempotency_key"], name="notification_idempotency_key"),
        ]

    def __str__(self) -> str:
        return f"{self.channel}:{self.recipient} [{self.status}]"


# The statuses a NotificationQueue row can have: every status but SENT.
QUEUED_STATUSES = tuple(status for status in Status.values if status != Status.SENT)


class NotificationQueue(models.Model):
    """Every notification not SENT, narrow: what the claim, the reaper, the backlog check and
    every read by status go through, so that the wide record keeps no index on a column those
    change.

    Written only by the triggers on `notification` (`notification_queue_*`), in
    the same statement that changes the record, under that record's row lock; never written
    directly. A row is the record's copy of status, priority, channel, due time, creation time
    and claim expiry, with a PROCESSING row's worker and a PENDING row's recipient digest; a
    record that becomes SENT leaves this table, so it holds the backlog, the claims in flight
    and the rows an operator may act on (FAILED, DEAD_LETTERED), and its size does not grow
    with delivered history. Statements that lock a notification lock the record (`FOR UPDATE
    OF n`), never this row, so lock order is always record first.
    """

    notification = models.OneToOneField(
        Notification,
        primary_key=True,
        db_column="id",
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="queue_entry",
    )
    client_id = models.UUIDField()
    status = models.CharField(max_length=16, choices=Status.choices)
    priority = models.SmallIntegerField(choices=Priority.choices)
    channel = models.CharField(max_length=16, choices=Channel.choices)
    due_at = models.DateTimeField()
    created_at = models.DateTimeField()
    claim_expires_at = models.DateTimeField(null=True)
    # A PROCESSING row's worker (the record's claimed_by); NULL in any other status, so the
    # index below holds only the claims in flight.
    claimed_by = models.CharField(max_length=200, null=True)
    # A PENDING row's md5(recipient)::uuid (`recipient_digest`); NULL in any other status, so a
    # claim computes none. A rate-limit deferral tells the key's rows at the head of the
    # client's due range by it without reading their records.
    recipient_digest = models.UUIDField(null=True)
    # The record's expiry and md5(cancellation_key)::uuid (`cancellation_digest`), copied at
    # insert; neither ever changes, so they cost the claim and the finish nothing.
    expires_at = models.DateTimeField(null=True)
    cancellation_digest = models.UUIDField(null=True)

    class Meta:
        db_table = "notification_queue"
        indexes = [
            # A (channel, client, recipient) key's waiting rows by due time: where a rate-limit
            # deferral continues the key's schedule from (the last slot it handed out, a
            # backward probe) and the row a freed slot lets go (the earliest held). Only
            # PENDING rows, so a claim writes no entry here; on the queue, not the record, so
            # a retry's new due time leaves the record's update HOT.
            models.Index(
                fields=["recipient_digest", "client_id", "channel", "due_at"],
                name="queue_pending_recipient",
                condition=Q(status=Status.PENDING),
            ),
            # The claim's loose index scan over the (priority, client) pairs that have waiting
            # rows, then each pair's due range (delivery/sql/queries.sql).
            models.Index(
                fields=["priority", "client_id", "due_at", "created_at"],
                name="queue_pending_client",
                condition=Q(status=Status.PENDING),
            ),
            # The earliest due row of each priority (the worker's next wake-up, /status).
            models.Index(
                fields=["priority", "due_at"],
                name="queue_pending_due",
                condition=Q(status=Status.PENDING),
            ),
            # The reaper looks for claims that expired.
            models.Index(
                fields=["claim_expires_at"],
                name="queue_claim_expiry",
                condition=Q(status=Status.PROCESSING),
            ),
            # The claims in flight by worker: the takeover of a dead worker's claims walks the
            # workers holding claims and reads only the dead ones' (delivery/sql/queries.sql,
            # notification_reclaim_expired). `claimed_by IS NOT NULL` (always true of a
            # claim) keeps it out of the plans of the other reads of PROCESSING rows, which
            # queue_claim_expiry serves.
            models.Index(
                fields=["claimed_by"],
                name="queue_claimed_by",
                condition=Q(status=Status.PROCESSING, claimed_by__isnull=False),
            ),
            # A client's listing by status, newest first, and its backlog count (PENDING).
            # This index and the next leave PROCESSING rows out: a claim (PENDING to
            # PROCESSING) then writes only the primary key's and queue_claim_expiry's entries.
            # PROCESSING rows (at most workers x batch) are listed and counted from
            # queue_claim_expiry.
            models.Index(
                fields=["client_id", "status", "-created_at", "-notification"],
                name="queue_client_status",
                condition=~Q(status=Status.PROCESSING),
            ),
            # The waiting rows that carry an expiry, by it: the worker's upkeep ends those
            # past it (`notifications_expire`) reading only them, whatever the backlog without
            # one. A row claimed meanwhile is ended by the worker's own check.
            models.Index(
                fields=["expires_at"],
                name="queue_pending_expiry",
                condition=Q(status=Status.PENDING, expires_at__isnull=False),
            ),
            # A client's unsent rows with a cancellation key, by the key's digest: what a cancel
            # by key walks (`notifications_cancel_by_key`), its own rows and no others.
            models.Index(
                fields=["client_id", "cancellation_digest"],
                name="queue_cancellable",
                condition=Q(
                    status__in=[Status.PENDING, Status.PROCESSING],
                    cancellation_digest__isnull=False,
                ),
            ),
            # By status across every client: the operator's listing and retries (FAILED,
            # DEAD_LETTERED, oldest first) and the counts of /status and /metrics by priority
            # and channel (index-only thanks to INCLUDE).
            models.Index(
                fields=["status", "created_at", "notification"],
                include=["channel", "priority"],
                name="queue_status",
                condition=~Q(status=Status.PROCESSING),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.notification_id} [{self.status}]"


# The due time of a row a digest bucket collected: it waits for the bucket's close, which ends
# it DIGESTED, and no claim ever reaches it (every claim takes rows due by now). A finite time,
# so that every reader of `due_at` can hold it (Python's datetime ends in year 9999).
DIGEST_HELD_DUE_AT = "9999-01-01T00:00:00+00:00"


class DigestState(models.TextChoices):
    # Collecting: creates with its identity inside its window join it.
    OPEN = "OPEN"
    # Closed to creates (its window ended): a worker's close marks its rows DIGESTED in
    # batches and then creates the digest, under a claim (token, worker, expiry) that another
    # worker takes over once it expires or its worker is dead. A bucket sealed by a create that
    # came after its window has no claim yet.
    CLOSING = "CLOSING"
    # Its digest exists (digest_id), or nothing was left to carry (digest_id NULL).
    CLOSED = "CLOSED"


class NotificationDigest(models.Model):
    """A digest bucket: the notifications of one client, channel, recipient (the user, in
    preference mode) and digest key created inside one window, collected at create instead of
    each being queued, and sent as one notification when the window closes.

    Invariants (docs/technical-design.md, "Digests"): at most one OPEN bucket per identity
    (`notification_digest_open`, unique), and a create joins only an OPEN bucket whose window
    has not ended, under the bucket's row lock; the close takes that lock first
    (`notification_digests_claim`, SKIP LOCKED), so a bucket's rows are fixed once it is
    CLOSING; `digest_id` is chosen by the first claim and kept by every takeover, so each row
    ends DIGESTED naming one digest, whichever worker marked it; a CLOSING bucket's writes are
    guarded by its claim token."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    client = models.ForeignKey(
        "clients.Client", on_delete=models.PROTECT, related_name="+", db_index=False
    )
    # md5 of (client, channel, user or recipient, digest key): the identity's one key.
    identity = models.UUIDField()
    digest_key = models.CharField(max_length=255)
    channel = models.CharField(max_length=16, choices=Channel.choices)
    recipient = models.CharField(max_length=RECIPIENT_MAX_LENGTH)
    user_id = models.CharField(max_length=255, null=True, blank=True)
    # The event whose (event, channel) template renders the digest.
    template = models.CharField(max_length=255)
    # The notification that opened the window (it went at once).
    opened_by = models.UUIDField()
    opened_at = models.DateTimeField()
    closes_at = models.DateTimeField()
    # Rows collected (counted at each create that joined).
    collected = models.PositiveIntegerField(default=0)
    state = models.CharField(max_length=16, choices=DigestState.choices, default=DigestState.OPEN)
    # The notification that carries the bucket: chosen by the first claim, kept by every later
    # one; the digest is created with this id (idempotency key `digest:<bucket id>`).
    digest_id = models.UUIDField(null=True, blank=True)
    # The rows the digest carries (those DIGESTED), once CLOSED.
    digested = models.PositiveIntegerField(null=True, blank=True)
    claim_token = models.UUIDField(null=True, blank=True)
    claimed_by = models.CharField(max_length=200, null=True, blank=True)
    claim_expires_at = models.DateTimeField(null=True, blank=True)
    closed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "notification_digest"
        verbose_name = "digest bucket"
        constraints = [
            # One collecting bucket per identity; a create locks it to join it.
            models.UniqueConstraint(
                fields=["identity"],
                name="notification_digest_open",
                condition=Q(state=DigestState.OPEN),
            ),
        ]
        indexes = [
            # The open buckets by close time: what the close claims once due.
            models.Index(
                fields=["closes_at"],
                name="notification_digest_due",
                condition=Q(state=DigestState.OPEN),
            ),
            # Buckets being closed: a claim past its expiry, or a dead worker's, is taken over.
            models.Index(
                fields=["claim_expires_at"],
                name="notification_digest_closing",
                condition=Q(state=DigestState.CLOSING),
            ),
            # The admin's list of one client's buckets, newest first.
            models.Index(fields=["client", "-opened_at"], name="notification_digest_client"),
            # Closed buckets by close time: what retention deletes once past its cutoff.
            models.Index(
                fields=["closed_at"],
                name="notification_digest_closed",
                condition=Q(state=DigestState.CLOSED),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.digest_key} {self.channel}:{self.recipient} [{self.state}]"
