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


def stored(repo, *, status: str, created_at: datetime = NOW, channel: str = "email", n: int = 0):
    repo.now = created_at
    created = services.notification_create(
        client_id=ACME,
        idempotency_key=f"k{n}-{uuid.uuid4()}",
        request=email(channel=channel),
        repository=repo,
        max_pending=10_000,
        max_attempts=6,
    ).notification
    record = dataclasses.replace(created, status=status, attempt_count=6, last_error="busy")
    repo.rows[record.id] = record
    return record


def test_retry_starts_the_attempts_again_and_records_who_and_when(repo):
    dead = stored(repo, status=Status.DEAD_LETTERED)
    later = NOW + timedelta(hours=1)

    retried = retries.notification_retry(
        notification_id=dead.id, operator="admin:ops", now=later, repository=repo
    )

    assert (retried.status, retried.attempt_count, retried.due_at) == ("PENDING", 0, later)
    assert (retried.operator_retries, retried.last_retried_by) == (1, "admin:ops")
    assert retried.last_error == "busy"


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


def test_bulk_retry_takes_the_oldest_of_one_status_and_counts_what_is_left(repo):
    rows = [
        stored(repo, status=Status.DEAD_LETTERED, created_at=NOW - timedelta(minutes=i), n=i)
        for i in range(5)
    ]
    stored(repo, status=Status.FAILED, n=99)

    result = retries.notifications_retry_bulk(
        status="DEAD_LETTERED", operator="x", now=NOW, limit=2, repository=repo
    )

    assert (result.retried, result.remaining) == (2, 3)
    oldest_two = {rows[4].id, rows[3].id}
    assert {r.id for r in repo.rows.values() if r.status == Status.PENDING} == oldest_two


@pytest.mark.parametrize(
    ("status", "limit"), [("SENT", 10), ("PENDING", 10), ("FAILED", 0), ("FAILED", 10_001)]
)
def test_bulk_retry_refuses_other_statuses_and_limits(repo, status, limit):
    with pytest.raises(InvalidRequest):
        retries.notifications_retry_bulk(
            status=status, operator="x", now=NOW, limit=limit, repository=repo
        )
