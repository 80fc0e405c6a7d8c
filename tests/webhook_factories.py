"""Webhook outbox rows as the delivery worker's finishing statement writes them, and the
database clock moved for webhook tests."""

from datetime import datetime, timedelta

import factory
from django.db import connection
from django.utils import timezone

from notifications.models import Status
from tests.factories import NotificationFactory
from webhooks.models import DeliveryState, WebhookEvent


class WebhookEventFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = WebhookEvent

    notification = factory.SubFactory(
        NotificationFactory, status=Status.SENT, attempt_count=1, sent_at=timezone.now()
    )
    client = factory.SelfAttribute("notification.client")
    status = factory.SelfAttribute("notification.status")
    attempt_count = factory.SelfAttribute("notification.attempt_count")
    occurred_at = factory.LazyFunction(timezone.now)
    state = DeliveryState.PENDING
    delivery_attempts = 0
    next_attempt_at = factory.SelfAttribute("occurred_at")
    created_at = factory.SelfAttribute("occurred_at")


class ShiftedDbClock:
    """Moves `notifyqueue_now()` (the database clock the sender's SQL reads) by an offset, from
    the database side. Inside a test's transaction the change is rolled back with it;
    `restore()` puts the real clock back for tests that commit."""

    REAL = "SELECT statement_timestamp()"

    def __init__(self) -> None:
        self.offset = timedelta(0)

    def advance(self, delta: timedelta) -> None:
        self.offset += delta
        seconds = self.offset.total_seconds()
        self._install(f"SELECT statement_timestamp() + make_interval(secs => {seconds!r})")

    def now(self) -> datetime:
        with connection.cursor() as cursor:
            cursor.execute("SELECT notifyqueue_now()")
            return cursor.fetchone()[0]

    def restore(self) -> None:
        self.offset = timedelta(0)
        self._install(self.REAL)

    @staticmethod
    def _install(body: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "CREATE OR REPLACE FUNCTION notifyqueue_now() RETURNS timestamptz "
                f"LANGUAGE sql STABLE PARALLEL SAFE AS $$ {body} $$"
            )
