"""`manage.py prune_notifications`: finished rows and their history go, in batches; nothing
still waiting, nothing whose webhook is still being delivered, nothing inside a window."""

from __future__ import annotations

import uuid
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from delivery.models import DeliveryAttempt, SimulatedProviderMessage
from delivery.repositories import RETENTION_SQL as QUERIES
from notifications.models import Notification, NotificationDigest, Status
from notifyqueue.history import uuid7
from notifyqueue.sqlfile import database_object_path
from preferences.models import InboxMessage
from ratelimits.models import RecipientDelivery
from tests.support.factories import ClientFactory, NotificationFactory
from tests.support.webhook_factories import WebhookEventFactory
from webhooks.models import DeliveryState, WebhookDeliveryAttempt, WebhookEvent

pytestmark = pytest.mark.django_db

OLD = timedelta(days=40)


def finished(client, *, age: timedelta = OLD, status: str = Status.SENT, **fields):
    at = timezone.now() - age
    fields = {"attempt_count": 1, **fields}
    return NotificationFactory(
        client=client, status=status, created_at=at, updated_at=at, id=uuid7(at), **fields
    )


def with_history(notification: Notification, *, webhook_state: str = DeliveryState.DELIVERED):
    at = notification.updated_at
    DeliveryAttempt.objects.create(
        notification=notification,
        claim_token=uuid.uuid4(),
        number=1,
        channel=notification.channel,
        worker="w",
        started_at=at,
        finished_at=at,
        outcome="SENT",
    )
    event = WebhookEventFactory(notification=notification, state=webhook_state, occurred_at=at)
    WebhookDeliveryAttempt.objects.create(
        event=event,
        claim_token=uuid.uuid4(),
        number=1,
        url="https://example.com/hook",
        started_at=at,
        finished_at=at,
        outcome="DELIVERED",
        status_code=200,
    )
    RecipientDelivery.objects.create(
        key=b"k" * 32, at=at, notification=notification, claim_token=uuid.uuid4()
    )
    InboxMessage.objects.create(
        id=uuid.uuid4(),
        client=notification.client,
        user_id="u-1",
        notification=notification,
        body="hi",
        created_at=at,
    )


def prune(*args: str) -> str:
    out = StringIO()
    call_command("prune_notifications", *args, stdout=out)
    return out.getvalue()


def test_finished_rows_older_than_the_age_go_with_their_whole_history():
    client = ClientFactory()
    sent = finished(client)
    with_history(sent)
    failed = finished(client, status=Status.DEAD_LETTERED)
    cancelled = finished(client, status=Status.CANCELLED)
    expired = finished(client, status=Status.EXPIRED)
    output = prune("--older-than", "30d")
    gone = {sent.id, failed.id, cancelled.id, expired.id}
    assert not Notification.objects.filter(id__in=gone).exists()
    assert not DeliveryAttempt.objects.filter(notification_id__in=gone).exists()
    assert not WebhookEvent.objects.filter(notification_id__in=gone).exists()
    assert not WebhookDeliveryAttempt.objects.exists()
    assert not RecipientDelivery.objects.filter(notification_id__in=gone).exists()
    assert not InboxMessage.objects.filter(notification_id__in=gone).exists()
    assert "done: deleted 4 notification(s)" in output
    assert "and 1 delivery attempt(s)" in output


def test_recent_waiting_and_still_reporting_rows_stay():
    client = ClientFactory()
    recent = finished(client, age=timedelta(days=29))
    # Created long ago but scheduled far ahead: still waiting.
    waiting = finished(client, status=Status.PENDING, sent_at=None, attempt_count=0)
    reporting = finished(client)
    with_history(reporting, webhook_state=DeliveryState.PENDING)
    prune("--older-than", "30d")
    kept = {recent.id, waiting.id, reporting.id}
    assert set(Notification.objects.values_list("id", flat=True)) == kept
    assert DeliveryAttempt.objects.filter(notification=reporting).count() == 1


def test_prunes_in_batches_and_prints_each():
    client = ClientFactory()
    rows = [finished(client, age=OLD + timedelta(minutes=n)) for n in range(5)]
    output = prune("--older-than", "30d", "--batch", "2")
    assert not Notification.objects.filter(id__in=[r.id for r in rows]).exists()
    assert [line.split(":")[0] for line in output.splitlines()] == [
        "batch 1",
        "batch 2",
        "batch 3",
        "done",
    ]
    assert "deleted 2 of 2 scanned" in output.splitlines()[0]


def test_cutoff_is_the_database_clock_minus_the_age():
    client = ClientFactory()
    row = finished(client, age=timedelta(days=10))
    with connection.cursor() as cursor:
        # The database's clock runs 21 days ahead (this test's transaction only).
        cursor.execute(
            "CREATE OR REPLACE FUNCTION notifyqueue_now() RETURNS timestamptz LANGUAGE sql "
            "STABLE AS $$ SELECT statement_timestamp() + interval '21 days' $$"
        )
    prune("--older-than", "30d")
    assert not Notification.objects.filter(id=row.id).exists()


def test_an_age_inside_the_rate_limit_window_is_refused(settings):
    settings.NOTIFYQUEUE_RATE_LIMIT_WINDOW_SECONDS = 3600
    finished(ClientFactory(), age=timedelta(hours=2))
    with pytest.raises(CommandError, match="rate-limit window"):
        prune("--older-than", "30m")
    with pytest.raises(CommandError, match=r"e\.g\. 30d"):
        prune("--older-than", "thirty days")
    assert Notification.objects.count() == 1


def test_every_table_that_refers_to_a_pruned_row_is_pruned_too():
    """A new reference to these tables must be handled by the prune statement: this test
    names the tables it must cover, from the models, as the database no longer checks every
    reference (docs/technical-design.md, "Foreign keys the hot path does not check"). The queue
    tables are the exception: the triggers on notification and webhook_event delete their rows."""
    from django.apps import apps

    sql = (
        QUERIES["notifications_prune_batch"]
        + database_object_path(
            "delivery/sql/functions/notifications_history_delete.sql"
        ).read_text()
    )
    pruned = {
        "notification",
        "webhook_event",
        "delivery_attempt",
        "inbox_message",
        "ratelimit_delivery",
        "webhook_delivery_attempt",
    }
    references = {
        model._meta.db_table
        for model in apps.get_models()
        for field in model._meta.concrete_fields
        if field.is_relation and field.related_model._meta.db_table in pruned
    }
    assert {"delivery_attempt", "ratelimit_delivery", "webhook_event"} <= references
    for table in references - {"notification_queue", "webhook_queue"}:
        assert f"DELETE FROM {table} " in sql, table


def test_a_batch_reads_the_recent_index_from_its_position():
    client = ClientFactory()
    for n in range(3):
        finished(client, age=OLD + timedelta(minutes=n))
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(
            "EXPLAIN (FORMAT JSON) " + QUERIES["notifications_prune_batch"],
            {
                "cutoff": timezone.now() - timedelta(days=30),
                "after_created_at": timezone.now() - timedelta(days=100),
                "after_id": uuid.UUID(int=0),
                "scan": 1000,
                "channels": ["email", "sms", "push", "in_app"],
            },
        )
        (plan,) = cursor.fetchone()
    assert "notification_recent" in str(plan)


@pytest.mark.django_db(transaction=True)
def test_each_batch_commits_with_every_foreign_key_satisfied():
    """Outside a test transaction each batch commits, so deferred foreign keys are checked."""
    client = ClientFactory()
    rows = [finished(client, age=OLD + timedelta(minutes=n)) for n in range(3)]
    for row in rows:
        with_history(row)
    prune("--older-than", "30d", "--batch", "2")
    assert not Notification.objects.filter(client=client).exists()
    assert not WebhookEvent.objects.exists()


def test_the_simulated_providers_records_of_a_pruned_row_go_with_it():
    """The simulated provider keeps one record per `<id>:<channel>` it was called with; a
    notification's records (on its channel and on a fallback's) go when it goes."""
    client = ClientFactory()
    old, kept = finished(client), finished(client, age=timedelta(days=1))
    at = timezone.now()
    for notification, channel in ((old, "email"), (old, "sms"), (kept, "email")):
        SimulatedProviderMessage.objects.create(
            idempotency_key=f"{notification.id}:{channel}",
            channel=channel,
            recipient=notification.recipient,
            calls=1,
            outcome="ACCEPTED",
            sends=1,
            first_call_at=at,
            last_call_at=at,
        )

    prune("--older-than", "30d")

    assert list(SimulatedProviderMessage.objects.values_list("idempotency_key", flat=True)) == [
        f"{kept.id}:email"
    ]


def digest_buckets(client, **at: timedelta) -> dict[str, uuid.UUID]:
    """One bucket per name: `closed_<n>` closed that long ago, `open`/`closing` opened then."""
    ids = {}
    with connection.cursor() as cursor:
        for name, age in at.items():
            state = name.split("_")[0].upper()
            ids[name] = uuid.uuid4()
            cursor.execute(
                """
                INSERT INTO notification_digest (
                    id, client_id, identity, digest_key, channel, recipient, template,
                    opened_by, opened_at, closes_at, collected, state, digested, closed_at)
                VALUES (%(id)s, %(client)s, gen_random_uuid(), %(name)s, 'email',
                        'a@example.com', 'comment', gen_random_uuid(), now() - %(age)s,
                        now() - %(age)s, 3, %(state)s,
                        CASE WHEN %(state)s = 'CLOSED' THEN 3 END,
                        CASE WHEN %(state)s = 'CLOSED' THEN now() - %(age)s END)
                """,
                {"id": ids[name], "client": client.id, "name": name, "age": age, "state": state},
            )
    return ids


def test_digest_buckets_closed_before_the_cutoff_go_and_no_other():
    client = ClientFactory()
    ids = digest_buckets(
        client,
        closed_old=OLD,
        closed_older=OLD * 2,
        closed_recent=timedelta(days=29),
        open_old=OLD,
        closing_old=OLD,
    )
    output = prune("--older-than", "30d", "--batch", "1")
    left = set(NotificationDigest.objects.values_list("id", flat=True))
    assert left == {ids["closed_recent"], ids["open_old"], ids["closing_old"]}
    assert "and 2 digest bucket(s) closed before it" in output


def test_a_digest_bucket_batch_reads_only_the_closed_buckets_it_deletes():
    client = ClientFactory()
    digest_buckets(client, **{f"open_{n}": OLD for n in range(2000)})
    digest_buckets(client, closed_old=OLD)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE notification_digest")
        cursor.execute(
            "EXPLAIN " + QUERIES["digests_prune_batch"],
            {"cutoff": timezone.now() - timedelta(days=30), "limit": 1000},
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "notification_digest_closed" in plan, plan
