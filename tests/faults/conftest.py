import pytest

from tests.factories import ClientFactory
from tests.webhook_receiver import WebhookReceiver


@pytest.fixture
def webhooks():
    with WebhookReceiver() as receiver:
        yield receiver


@pytest.fixture
def client(webhooks):
    return ClientFactory(webhook_url=webhooks.url)
