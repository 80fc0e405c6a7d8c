"""The database itself enforces the notification table's invariants."""

import uuid

import pytest
from django.db import IntegrityError, connection, transaction

from notifications.models import Status
from notifyqueue.history import uuid7
from notifyqueue.vocabulary import Channel, Priority
from tests.support.factories import ClientFactory, NotificationFactory

pytestmark = pytest.mark.django_db


def test_idempotency_key_is_unique_per_client():
    """Whoever writes the table: a second row for a client's key is not stored, whether it would
    land in the first one's weekly partition or in another's (the trigger
    notification_key_unique), as a create's ON CONFLICT DO NOTHING leaves it out."""
    first = NotificationFactory(idempotency_key="order-1")
    week_before = uuid.UUID(int=first.id.int - (7 * 86_400_000 << 80))
    with connection.cursor() as cursor:
        for other_id in (uuid7(), week_before, uuid.uuid4()):
            cursor.execute(
                "INSERT INTO notification SELECT (n).* FROM ("
                "SELECT jsonb_populate_record(n, jsonb_build_object('id', %s::uuid)) AS n "
                "FROM notification AS n WHERE id = %s) AS c",
                [other_id, first.id],
            )
            assert cursor.rowcount == 0
        cursor.execute(
            "SELECT count(*) FROM notification WHERE client_id = %s AND idempotency_key = %s",
            [first.client_id, "order-1"],
        )
        assert cursor.fetchone() == (1,)
    # Another client may use the same key.
    NotificationFactory(client=ClientFactory(), idempotency_key="order-1")


REFUSED = [
    ("status", "LOST"),
    ("channel", "pigeon"),
    ("priority", 7),
    ("priority", -1),
    ("attempt_count", -1),
    ("max_attempts", -1),
    ("operator_retries", -1),
]


@pytest.mark.parametrize("column, value", REFUSED)
def test_check_constraints_reject_unknown_values(column, value):
    notification = NotificationFactory()
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE notification SET {column} = %s WHERE id = %s", [value, notification.id]
        )


@pytest.mark.parametrize("column, value", REFUSED)
def test_an_insert_breaking_a_column_rule_is_refused(column, value):
    with pytest.raises(IntegrityError), transaction.atomic():
        NotificationFactory(**{column: value})


def test_each_domain_admits_every_value_the_models_name():
    """The one-column rules are domains' CHECKs written out by a migration, and Django does
    not compare them with the models (a field's choices make no constraint, and `DomainColumn`
    makes none): a status, channel or priority added to the models without a migration would
    be refused by the database on its first write. Every value the models name is admitted;
    the ones beside the priorities are not (the other refusals are in REFUSED above)."""
    admitted = [
        *(("notification_status", value) for value in Status.values),
        *(("notification_channel", value) for value in Channel.values),
        *(("notification_priority", value) for value in Priority.values),
        ("notification_count", 0),
    ]
    with connection.cursor() as cursor:
        for domain, value in admitted:
            cursor.execute(f"SELECT CAST(%s AS {domain})", [value])
    for value in (min(Priority.values) - 1, max(Priority.values) + 1):
        with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT CAST(%s AS notification_priority)", [value])


def test_the_table_checks_only_rules_between_columns():
    """A rule on one column is its domain's: PostgreSQL prepares a table's
    CHECKs again for every statement that writes the table, a domain's once per connection."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conname FROM pg_constraint "
            "WHERE conrelid = 'notification'::regclass AND contype = 'c' ORDER BY 1"
        )
        assert [name for (name,) in cursor.fetchall()] == [
            "notification_attempts_bounded",
            "notification_claim_iff_processing",
        ]
        cursor.execute(
            "SELECT t.typname, c.conname FROM pg_constraint AS c "
            "JOIN pg_type AS t ON t.oid = c.contypid "
            "WHERE t.typnamespace = 'public'::regnamespace ORDER BY 1"
        )
        assert cursor.fetchall() == [
            ("notification_channel", "notification_channel_valid"),
            ("notification_count", "notification_count_not_negative"),
            ("notification_priority", "notification_priority_valid"),
            ("notification_status", "notification_status_valid"),
        ]


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


def test_the_rows_the_hot_path_writes_beside_a_notification_carry_no_deferred_check():
    """A foreign key from Django is checked at commit, a look-up per row that locks the
    notification FOR KEY SHARE. The claim, the admission and the finish write attempts,
    rate-limit records and webhook events for notifications they update in the same
    transaction, so each check met that update: a MultiXact per message (two workers drained
    12-15 % slower). Those children exist by construction. The inbox has no check either: a
    week of history is dropped whole, its inbox messages deleted first by retention."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conrelid::regclass::text FROM pg_constraint "
            "WHERE contype = 'f' AND confrelid = 'notification'::regclass ORDER BY 1"
        )
        assert [table for (table,) in cursor.fetchall()] == []
