"""The database itself enforces the notification table's invariants."""

import uuid

import pytest
from django.db import IntegrityError, connection, transaction

from notifications.models import Status
from tests.support.factories import ClientFactory, NotificationFactory

pytestmark = pytest.mark.django_db


def test_idempotency_key_is_unique_per_client():
    first = NotificationFactory(idempotency_key="order-1")
    with pytest.raises(IntegrityError), transaction.atomic():
        NotificationFactory(client=first.client, idempotency_key="order-1")
    # Another client may use the same key.
    NotificationFactory(client=ClientFactory(), idempotency_key="order-1")


@pytest.mark.parametrize(
    "column, value",
    [("status", "LOST"), ("channel", "pigeon"), ("priority", 7), ("priority", -1)],
)
def test_check_constraints_reject_unknown_values(column, value):
    notification = NotificationFactory()
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE notification SET {column} = %s WHERE id = %s", [value, notification.id]
        )


def test_processing_row_must_name_its_claim():
    notification = NotificationFactory()
    with pytest.raises(IntegrityError), transaction.atomic():
        type(notification).objects.filter(id=notification.id).update(status=Status.PROCESSING)


def test_claim_fields_are_cleared_outside_processing():
    notification = NotificationFactory()
    with pytest.raises(IntegrityError), transaction.atomic():
        type(notification).objects.filter(id=notification.id).update(claim_token=uuid.uuid4())


def test_pending_due_index_holds_only_pending_rows():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_get_indexdef(indexrelid) FROM pg_index "
            "WHERE indexrelid = 'queue_pending_due'::regclass"
        )
        (definition,) = cursor.fetchone()
    assert "ON public.notification_queue" in definition
    assert "(priority, due_at)" in definition
    assert "WHERE ((status)::text = 'PENDING'::text)" in definition
