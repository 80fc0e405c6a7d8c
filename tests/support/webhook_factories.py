"""Webhook outbox rows as the delivery worker's finishing statement writes them."""

import factory
from django.utils import timezone

from notifications.models import Status
from tests.support.factories import NotificationFactory
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
