"""factory-boy factories for rows the tests need in bulk."""

import hashlib
import uuid

import factory
from django.utils import timezone

from clients.models import Client
from notifications.models import Channel, Notification, Priority, Status


class ClientFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Client

    name = factory.Sequence(lambda n: f"client-{n}")


class NotificationFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Notification

    client = factory.SubFactory(ClientFactory)
    idempotency_key = factory.LazyFunction(lambda: str(uuid.uuid4()))
    request_fingerprint = factory.LazyAttribute(
        lambda o: hashlib.sha256(o.idempotency_key.encode()).hexdigest()
    )
    channel = Channel.EMAIL
    recipient = factory.Sequence(lambda n: f"user{n}@example.com")
    subject = "Hello"
    body = "Your code is 123456"
    priority = Priority.NORMAL
    status = Status.PENDING
    send_at = factory.LazyFunction(timezone.now)
    due_at = factory.SelfAttribute("send_at")
    max_attempts = 6
    created_at = factory.LazyFunction(timezone.now)
    updated_at = factory.SelfAttribute("created_at")
