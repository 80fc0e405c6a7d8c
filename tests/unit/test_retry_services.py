"""Operator retry rules, with the in-memory repository: no database is touched here."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from notifications import retries, services
from notifications.models import Status
from notifyqueue.errors import InvalidRequest
from tests.support.fake_repository import InMemoryNotificationRepository
from tests.unit.test_notification_services import ACME, email

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def repo() -> InMemoryNotificationRepository:
    return InMemoryNotificationRepository()


def stored(repo, *, status: str):
    """A notification in `status`, as the worker would have left it."""
    created = services.notification_create(
        client_id=ACME,
        idempotency_key=f"k-{uuid.uuid4()}",
        request=email(),
        repository=repo,
        max_pending=10_000,
        max_attempts=6,
    ).notification
    record = dataclasses.replace(created, status=status, attempt_count=6, last_error="busy")
    repo.rows[record.id] = record
    return record


def test_retry_answers_the_row_the_store_sent_back_stamped_with_the_operator(repo):
    dead = stored(repo, status=Status.DEAD_LETTERED)
    later = NOW + timedelta(hours=1)

    retried = retries.notification_retry(
        notification_id=dead.id, operator="admin:ops", now=later, repository=repo
    )

    assert retried == repo.rows[dead.id]
    assert (retried.status, retried.last_retried_by, retried.last_retried_at) == (
        "PENDING",
        "admin:ops",
        later,
    )


@pytest.mark.parametrize("status", [Status.PENDING, Status.PROCESSING, Status.SENT])
def test_retry_of_another_status_is_a_conflict_naming_it(repo, status):
    row = stored(repo, status=status)
    with pytest.raises(retries.NotificationNotRetryable) as refused:
        retries.notification_retry(notification_id=row.id, operator="x", now=NOW, repository=repo)
    assert refused.value.fields == {"status": [status]}


def test_retry_of_an_unknown_id_is_not_found(repo):
    with pytest.raises(services.NotificationNotFound):
        retries.notification_retry(
            notification_id=uuid.uuid4(), operator="x", now=NOW, repository=repo
        )


def test_bulk_retry_answers_how_many_it_retried_and_how_many_of_that_status_are_left(repo):
    for _ in range(5):
        stored(repo, status=Status.DEAD_LETTERED)
    stored(repo, status=Status.FAILED)

    result = retries.notifications_retry_bulk(
        status="DEAD_LETTERED", operator="x", now=NOW, limit=2, repository=repo
    )

    assert (result.retried, result.remaining) == (2, 3)


@pytest.mark.parametrize(
    ("status", "limit"), [("SENT", 10), ("PENDING", 10), ("FAILED", 0), ("FAILED", 10_001)]
)
def test_bulk_retry_refuses_other_statuses_and_limits(repo, status, limit):
    with pytest.raises(InvalidRequest):
        retries.notifications_retry_bulk(
            status=status, operator="x", now=NOW, limit=limit, repository=repo
        )
