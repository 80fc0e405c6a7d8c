"""Service rules, tested with the in-memory repository: no database is touched here."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from notifications import services
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
    UnknownTemplate,
)
from notifyqueue.errors import InvalidRequest
from tests.unit.fake_repository import InMemoryNotificationRepository

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
    return services.notification_create(
        client_id=client_id,
        idempotency_key=key,
        request=request or email(),
        now=now,
        repository=repo,
        max_pending=kwargs.pop("max_pending", 100),
        max_attempts=kwargs.pop("max_attempts", 6),
        **kwargs,
    )


def test_create_stores_a_pending_notification_due_now(repo):
    result = create(repo)
    assert result.created is True
    stored = repo.rows[result.notification.id]
    assert stored.status == Status.PENDING
    assert stored.send_at == stored.due_at == NOW
    assert stored.max_attempts == 6
    assert stored.priority is Priority.NORMAL


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


def test_idempotency_keys_are_scoped_per_client(repo):
    create(repo, client_id=ACME)
    other = create(repo, client_id=OTHER)
    assert other.created is True
    assert repo.inserts == 2


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


def test_send_at_in_the_past_means_now(repo):
    result = create(repo, email(send_at=NOW - timedelta(days=1)))
    assert result.notification.send_at == NOW
    assert result.notification.due_at == NOW


def test_send_at_in_the_future_is_kept(repo):
    later = NOW + timedelta(hours=3)
    assert create(repo, email(send_at=later)).notification.due_at == later


def test_delay_seconds_counts_from_now(repo):
    result = create(repo, email(delay_seconds=90))
    assert result.notification.send_at == NOW + timedelta(seconds=90)


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
    assert caught.value.fields == {"template": ["There is no template named 'order_shipped'."]}
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
        return services.notification_list(
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
        services.notification_list(
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
        now=NOW,
        repository=repo,
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
            now=NOW,
            repository=repo,
            max_pending=0,
            max_attempts=6,
        )
    assert len(repo.rows) == 1
