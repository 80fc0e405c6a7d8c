import pytest

from tests.support.factories import ClientFactory
from tests.support.webhook_receiver import WebhookReceiver


@pytest.fixture
def webhooks():
    with WebhookReceiver() as receiver:
        yield receiver


@pytest.fixture
def client(webhooks):
    return ClientFactory(webhook_url=webhooks.url)
