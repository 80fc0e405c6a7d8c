"""Fixtures shared by the integration tests."""

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from tests.support.http_servers import LoopbackProvider, ScriptedHTTPServer


@pytest.fixture
def raw_server():
    """Starts ScriptedHTTPServers (raw answers, any bytes) on loopback; closes them after."""
    servers = []

    def start(*scripts, default=None):
        servers.append(ScriptedHTTPServer(*scripts, default=default))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def loopback():
    """A LoopbackProvider on 127.0.0.1 (idempotency keys honoured; `hold` to stall it)."""
    server = LoopbackProvider()
    server.url = server.start()
    yield server
    server.stop()


@pytest.fixture
def superuser(client):
    """Django's test client, logged in as a superuser: the admin as an operator sees it."""
    client.force_login(User.objects.create_superuser("ops", "ops@example.com", "pw"))
    return client


@pytest.fixture
def http(api) -> APIClient:
    """The acme client, with server errors answered (as in production) instead of raised."""
    api.raise_request_exception = False
    return api
