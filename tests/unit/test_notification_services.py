"""Service rules, tested with the in-memory repository: no database is touched here."""

from __future__ import annotations

import dataclasses
import threading
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from notifications import listing, services
from notifications.models import Priority, Status
from notifications.repositories import ListFilters
from notifications.services import (
    BatchItem,
    IdempotencyKeyReused,
    NotificationNotCancellable,
    NotificationNotFound,
    NotificationRequest,
    RenderedContent,
    TooManyPending,
)
from notifyqueue.errors import InvalidRequest
from templates.services import UnknownTemplate
from tests.support.fake_repository import InMemoryNotificationRepository

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
ACME = uuid.UUID("00000000-0000-0000-0000-00000000ac3e")
OTHER = uuid.UUID("00000000-0000-0000-0000-0000000000b2")


def email(**overrides) -> NotificationRequest:
    fields = {"channel": "email", "recipient": "ada@example.com", "body": "123456"}
    return NotificationRequest(**{**fields, **overrides})


@pytest.fixture
def repo() -> InMemoryNotificationRepository:
    return InMemoryNotificationRepository()


def create(repo, request=None, *, key="k-1", client_id=ACME, now=NOW, **kwargs):
    """A create at database time `now`; the backlog is counted afresh unless one is given."""
    repo.now = now
    kwargs.setdefault("backlog", services.ClientBacklog())
    return services.notification_create(
        client_id=client_id,
        idempotency_key=key,
        request=request or email(),
        repository=repo,
        max_pending=kwargs.pop("max_pending", 100),
        max_attempts=kwargs.pop("max_attempts", 6),
        **kwargs,
    )


class Recording(InMemoryNotificationRepository):
    """Keeps every new row the service handed it."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = []

    def insert(self, *, new):
        self.asked.append(new)
        return super().insert(new=new)

    def insert_many(self, *, client_id, new):
        self.asked.extend(new)
        return super().insert_many(client_id=client_id, new=new)


@pytest.mark.parametrize(
    "timing",
    [
        {},
        {"send_at": NOW - timedelta(days=1)},
        {"send_at": NOW + timedelta(hours=3)},
        {"delay_seconds": 90},
    ],
)
def test_a_create_hands_the_store_the_request_and_leaves_the_times_to_it(timing):
    """The store decides send and due times by the database clock (the repository contract
    suite checks how): single or batched, the service passes on what the client asked."""
    recording = Recording()
    request = email(**timing)
    made = create(recording, request)
    services.notification_batch_create(
        client_id=ACME,
        items=[BatchItem(idempotency_key="k-2", request=request)],
        repository=recording,
        backlog=services.ClientBacklog(),
        max_pending=100,
        max_attempts=6,
    )
    assert made.created is True
    assert [new.idempotency_key for new in recording.asked] == ["k-1", "k-2"]
    for new in recording.asked:
        assert (new.client_id, new.channel, new.recipient, new.body) == (
            ACME,
            "email",
            "ada@example.com",
            "123456",
        )
        assert (new.priority, new.max_attempts) == (Priority.NORMAL, 6)
        assert (new.send_at, new.delay_seconds) == (request.send_at, request.delay_seconds)


def test_same_key_and_request_replays_the_original(repo):
    first = create(repo)
    again = create(repo, now=NOW + timedelta(minutes=5))
    assert again.created is False
    assert again.notification == first.notification
    assert repo.inserts == 1


def test_same_key_with_a_different_request_is_a_conflict(repo):
    create(repo)
    with pytest.raises(IdempotencyKeyReused):
        create(repo, email(body="654321"))
    assert repo.inserts == 1


def test_a_race_lost_at_insert_is_still_a_replay(repo):
    """The lookup found nothing, but another request inserted first: the insert decides."""

    class LateLookup(InMemoryNotificationRepository):
        def get_by_idempotency_key(self, **kwargs):
            return None

    racing = LateLookup()
    first = create(racing)
    again = create(racing)
    assert again.created is False
    assert again.notification.id == first.notification.id
    with pytest.raises(IdempotencyKeyReused):
        create(racing, email(subject="changed"))


def test_fingerprint_ignores_how_a_default_was_expressed():
    assert services.notification_request_fingerprint(
        email()
    ) == services.notification_request_fingerprint(email(priority=Priority.NORMAL))
    assert services.notification_request_fingerprint(
        email()
    ) != services.notification_request_fingerprint(email(priority=Priority.HIGH))


def test_fingerprint_compares_send_at_as_an_instant():
    utc = email(send_at=datetime(2026, 12, 1, 12, 0, tzinfo=UTC))
    paris = email(send_at=datetime.fromisoformat("2026-12-01T13:00:00+01:00"))
    assert services.notification_request_fingerprint(
        utc
    ) == services.notification_request_fingerprint(paris)


def test_body_over_64_kib_of_utf8_is_refused_and_nothing_is_stored(repo):
    # 21,846 three-byte characters: under 64 Ki characters, over 64 KiB.
    with pytest.raises(InvalidRequest) as caught:
        create(repo, email(body="€" * 21_846))
    assert "body" in caught.value.fields
    assert repo.rows == {}


def test_body_of_exactly_64_kib_is_accepted(repo):
    assert create(repo, email(body="x" * 65_536)).created is True


def test_template_is_unknown_until_templates_exist(repo):
    with pytest.raises(UnknownTemplate) as caught:
        create(repo, email(body=None, template="order_shipped", payload={"n": 1}))
    assert caught.value.fields == {
        "template": ["There is no email template for event 'order_shipped'."]
    }
    assert repo.rows == {}


def test_a_renderer_plugs_in_and_its_body_is_size_checked(repo):
    class Renderer:
        def __init__(self, body: str) -> None:
            self.body = body

        def render(self, *, client_id, request):
            return RenderedContent(
                channel="push", recipient="device-token-1", subject="", body=self.body
            )

    made = create(repo, email(body=None, template="hi"), renderer=Renderer("Hi Ada"))
    assert (made.notification.channel, made.notification.body) == ("push", "Hi Ada")
    with pytest.raises(InvalidRequest):
        create(repo, email(body=None, template="hi"), key="k-2", renderer=Renderer("x" * 70_000))


def test_backlog_over_the_limit_refuses_new_requests_with_retry_after(repo):
    for n in range(3):
        create(repo, key=f"k-{n}", max_pending=2)
    with pytest.raises(TooManyPending) as caught:
        create(repo, key="k-new", max_pending=2)
    assert caught.value.headers == {"Retry-After": str(services.BACKLOG_RETRY_AFTER_S)}
    assert len(repo.rows) == 3


def test_backlog_over_the_limit_still_answers_replays(repo):
    for n in range(3):
        create(repo, key=f"k-{n}", max_pending=2)
    assert create(repo, key="k-0", max_pending=2).created is False


def test_idempotency_key_rules():
    assert services.idempotency_key_problem("order-17") is None
    assert services.idempotency_key_problem("a" * 255) is None
    for bad in (None, "", "   ", "a" * 256, "tab\there", "é"):
        assert services.idempotency_key_problem(bad) is not None


def test_get_is_scoped_to_the_owner_unless_operator(repo):
    made = create(repo).notification
    with pytest.raises(NotificationNotFound):
        services.notification_get(
            notification_id=made.id, client_id=OTHER, is_operator=False, repository=repo
        )
    found = services.notification_get(
        notification_id=made.id, client_id=OTHER, is_operator=True, repository=repo
    )
    assert found == made


def test_cancel_pending_then_again_is_a_conflict(repo):
    made = create(repo).notification
    later = NOW + timedelta(seconds=5)
    cancelled = services.notification_cancel(
        notification_id=made.id, client_id=ACME, now=later, repository=repo
    )
    assert (cancelled.status, cancelled.updated_at) == (Status.CANCELLED, later)
    with pytest.raises(NotificationNotCancellable) as caught:
        services.notification_cancel(
            notification_id=made.id, client_id=ACME, now=later, repository=repo
        )
    assert "CANCELLED" in caught.value.message


def test_cancel_of_another_clients_notification_is_not_found(repo):
    made = create(repo).notification
    with pytest.raises(NotificationNotFound):
        services.notification_cancel(
            notification_id=made.id, client_id=OTHER, now=NOW, repository=repo
        )
    assert repo.rows[made.id].status == Status.PENDING


def test_list_walks_forward_and_back_with_cursors(repo):
    ids = [
        create(repo, key=f"k-{n}", now=NOW + timedelta(seconds=n)).notification.id for n in range(5)
    ]
    newest_first = list(reversed(ids))

    def page(cursor=None):
        return listing.notification_list(
            client_id=ACME,
            is_operator=False,
            filters=ListFilters(),
            cursor=cursor,
            page_size=2,
            repository=repo,
        )

    first = page()
    assert [r.id for r in first.notifications] == newest_first[:2]
    assert first.previous_cursor is None
    second = page(first.next_cursor)
    assert [r.id for r in second.notifications] == newest_first[2:4]
    third = page(second.next_cursor)
    assert [r.id for r in third.notifications] == newest_first[4:]
    assert third.next_cursor is None
    back = page(third.previous_cursor)
    assert [r.id for r in back.notifications] == newest_first[2:4]
    start = page(back.previous_cursor)
    assert [r.id for r in start.notifications] == newest_first[:2]
    assert start.previous_cursor is None


def test_list_rejects_a_forged_cursor(repo):
    with pytest.raises(InvalidRequest) as caught:
        listing.notification_list(
            client_id=ACME,
            is_operator=False,
            filters=ListFilters(),
            cursor="not-a-cursor",
            repository=repo,
        )
    assert "cursor" in caught.value.fields


def test_batch_creates_each_item_on_its_own(repo):
    invalid = InvalidRequest("recipient: bad", fields={"recipient": ["bad"]})
    outcomes = services.notification_batch_create(
        client_id=ACME,
        items=[
            BatchItem(idempotency_key="a", request=email()),
            invalid,
            BatchItem(idempotency_key="a", request=email()),
            BatchItem(idempotency_key="a", request=email(body="other")),
            BatchItem(idempotency_key="t", request=email(body=None, template="x")),
        ],
        repository=repo,
        backlog=services.ClientBacklog(),
        max_pending=100,
        max_attempts=6,
    )
    assert [o.http_status for o in outcomes] == [201, 400, 200, 409, 400]
    assert outcomes[1].error is invalid
    assert outcomes[0].notification == outcomes[2].notification
    assert isinstance(outcomes[4].error, UnknownTemplate)
    assert len(repo.rows) == 1


def test_batch_over_the_backlog_is_refused_whole(repo):
    create(repo, key="k-0", max_pending=0)
    with pytest.raises(TooManyPending):
        services.notification_batch_create(
            client_id=ACME,
            items=[BatchItem(idempotency_key="b", request=email())],
            repository=repo,
            backlog=services.ClientBacklog(),
            max_pending=0,
            max_attempts=6,
        )
    assert len(repo.rows) == 1


class FakeMonotonic:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_backlog_is_counted_once_and_this_process_adds_its_own_creates(repo):
    backlog = services.ClientBacklog(clock=FakeMonotonic())
    for n in range(3):
        create(repo, key=f"k-{n}", max_pending=2, backlog=backlog)
    with pytest.raises(TooManyPending):
        create(repo, key="k-new", max_pending=2, backlog=backlog)
    assert repo.pending_counts == 1
    assert len(repo.rows) == 3


def test_backlog_is_recounted_after_the_interval_and_sees_rows_sent_elsewhere(repo):
    clock = FakeMonotonic()
    backlog = services.ClientBacklog(clock=clock)
    for n in range(3):
        create(repo, key=f"k-{n}", max_pending=2, backlog=backlog)
    for record in list(repo.rows.values()):
        repo.rows[record.id] = dataclasses.replace(record, status=Status.SENT)
    clock.now += services.BACKLOG_RECOUNT_S - 0.01
    with pytest.raises(TooManyPending):
        create(repo, key="k-new", max_pending=2, backlog=backlog)
    clock.now += 0.02
    assert create(repo, key="k-new", max_pending=2, backlog=backlog).created is True
    assert repo.pending_counts == 2


def test_backlog_sees_rows_other_processes_created_at_the_next_count(repo):
    clock = FakeMonotonic()
    mine, theirs = services.ClientBacklog(clock=clock), services.ClientBacklog(clock=clock)
    create(repo, key="mine-0", max_pending=2, backlog=mine)
    create(repo, key="theirs-0", max_pending=2, backlog=theirs)
    create(repo, key="theirs-1", max_pending=2, backlog=theirs)
    # Within the interval `mine` knows only its own row: the overshoot the docs bound.
    assert create(repo, key="mine-1", max_pending=2, backlog=mine).created is True
    clock.now += services.BACKLOG_RECOUNT_S
    with pytest.raises(TooManyPending):
        create(repo, key="mine-2", max_pending=2, backlog=mine)


def test_a_slow_backlog_count_is_spaced_out_in_proportion(repo):
    clock = FakeMonotonic()

    class SlowCount(InMemoryNotificationRepository):
        def pending_count(self, *, client_id, limit):
            clock.now += 0.1
            return super().pending_count(client_id=client_id, limit=limit)

    slow = SlowCount()
    backlog = services.ClientBacklog(clock=clock)
    create(slow, key="k-0", backlog=backlog)
    clock.now += services.BACKLOG_RECOUNT_S
    create(slow, key="k-1", backlog=backlog)
    assert slow.pending_counts == 1
    clock.now += 0.1 * services.BACKLOG_COUNT_SHARE
    create(slow, key="k-2", backlog=backlog)
    assert slow.pending_counts == 2


def test_while_one_thread_recounts_the_others_check_the_figure_they_have(repo):
    clock = FakeMonotonic()
    counting, release = threading.Event(), threading.Event()

    class HeldCount(InMemoryNotificationRepository):
        hold = False

        def pending_count(self, *, client_id, limit):
            if self.hold:
                counting.set()
                assert release.wait(10)
            return super().pending_count(client_id=client_id, limit=limit)

    held = HeldCount()
    backlog = services.ClientBacklog(clock=clock)
    for n in range(2):
        create(held, key=f"k-{n}", max_pending=1, backlog=backlog)
    clock.now += services.BACKLOG_RECOUNT_S
    held.hold = True
    outcomes = []

    def recount():
        try:
            create(held, key="k-2", max_pending=1, backlog=backlog)
        except TooManyPending as exc:
            outcomes.append(exc)

    recounter = threading.Thread(target=recount)
    recounter.start()
    try:
        assert counting.wait(10)
        # The figure says 2 of at most 1: the others are refused from it while the count runs.
        with pytest.raises(TooManyPending):
            create(held, key="k-3", max_pending=1, backlog=backlog)
        assert held.pending_counts == 1  # the held recount has not reached it yet
    finally:
        release.set()
        recounter.join(10)
    assert held.pending_counts == 2
    assert len(outcomes) == 1 and len(held.rows) == 2


def test_a_recount_that_failed_is_made_by_the_next_create(repo):
    clock = FakeMonotonic()

    class FailingOnce(InMemoryNotificationRepository):
        fail = False

        def pending_count(self, *, client_id, limit):
            if self.fail:
                self.fail = False
                raise RuntimeError("connection lost")
            return super().pending_count(client_id=client_id, limit=limit)

    failing = FailingOnce()
    backlog = services.ClientBacklog(clock=clock)
    create(failing, key="k-0", max_pending=2, backlog=backlog)
    clock.now += services.BACKLOG_RECOUNT_S
    failing.fail = True
    with pytest.raises(RuntimeError):
        create(failing, key="k-1", max_pending=2, backlog=backlog)
    assert create(failing, key="k-1", max_pending=2, backlog=backlog).created is True
    assert failing.pending_counts == 2


def test_a_changed_limit_is_counted_afresh(repo):
    backlog = services.ClientBacklog(clock=FakeMonotonic())
    for n in range(3):
        create(repo, key=f"k-{n}", max_pending=10, backlog=backlog)
    with pytest.raises(TooManyPending):
        create(repo, key="k-new", max_pending=2, backlog=backlog)
    assert repo.pending_counts == 2


def test_batch_inserts_every_item_in_one_call_and_answers_in_order(repo):
    calls = []

    class Recording(InMemoryNotificationRepository):
        def insert_many(self, *, client_id, new):
            calls.append([item.idempotency_key for item in new])
            return super().insert_many(client_id=client_id, new=new)

    recording = Recording()
    create(recording, key="old")
    outcomes = services.notification_batch_create(
        client_id=ACME,
        items=[BatchItem(idempotency_key=f"n-{n}", request=email()) for n in range(5)]
        + [
            BatchItem(idempotency_key="old", request=email()),
            BatchItem(idempotency_key="old", request=email(body="changed")),
            BatchItem(idempotency_key="n-1", request=email(body="changed")),
        ],
        repository=recording,
        backlog=services.ClientBacklog(),
        max_pending=100,
        max_attempts=6,
    )
    assert calls == [["n-0", "n-1", "n-2", "n-3", "n-4", "old"]]
    assert [o.http_status for o in outcomes] == [201] * 5 + [200, 409, 409]
    assert [o.notification.idempotency_key for o in outcomes[:6]] == [
        "n-0",
        "n-1",
        "n-2",
        "n-3",
        "n-4",
        "old",
    ]
