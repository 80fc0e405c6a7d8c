"""Shared fixtures. Every test runs against real PostgreSQL (embedded, or DATABASE_URL)."""

from __future__ import annotations

import pytest
from django.db import connection
from rest_framework.test import APIClient

import health.repositories
from clients.models import ClientAPIKey
from health.repositories import PacedCounts
from tests.support.browser import CHROMIUM
from tests.support.clock import DbClock
from tests.support.factories import ClientFactory


@pytest.fixture
def make_client(db):
    """Creates an API client; returns (Client, plain api key)."""

    def make(
        name: str = "acme",
        *,
        is_operator: bool = False,
        webhook_url: str = "",
        may_send_critical: bool = False,
    ):
        client = ClientFactory(
            name=name,
            is_operator=is_operator,
            webhook_url=webhook_url,
            may_send_critical=may_send_critical,
        )
        _, key = ClientAPIKey.objects.create_key(name=f"{name} key", client=client)
        return client, key

    return make


@pytest.fixture
def acme(make_client):
    return make_client("acme")


@pytest.fixture
def api(acme) -> APIClient:
    """An HTTP client authenticated as the `acme` client."""
    http = APIClient()
    http.credentials(HTTP_AUTHORIZATION=f"Api-Key {acme[1]}")
    return http


@pytest.fixture
def database_url() -> str:
    """A URL for the test database, for subprocesses and extra connections."""
    s = connection.settings_dict
    host = s["HOST"]
    if host.startswith("/"):
        return f"postgresql://{s['USER']}:{s['PASSWORD'] or ''}@/{s['NAME']}?host={host}"
    port = f":{s['PORT']}" if s["PORT"] else ""
    return f"postgresql://{s['USER']}:{s['PASSWORD'] or ''}@{host}{port}/{s['NAME']}"


@pytest.fixture(autouse=True)
def _database_clock_restored(django_db_blocker):
    """A test that froze the database clock (DbClock) gets the real one back afterwards."""
    yield
    if DbClock.installed:
        with django_db_blocker.unblock():
            DbClock.restore()


@pytest.fixture(autouse=True)
def _queue_counts_read_afresh(monkeypatch):
    """/status and /metrics read their counts afresh in every test: a count is reused only
    when it took long to read (health.repositories.PacedCounts, tested on its own), and a
    slow machine must not make a test see the counts of an earlier request. A clock that never
    moves makes every count take no time."""
    monkeypatch.setattr(health.repositories, "COUNTS", PacedCounts(clock=lambda: 0.0))


@pytest.fixture
def workers():
    """Register in-process workers (`workers(worker)`); each is stopped and shut down after."""
    started = []
    yield started.append
    for worker in started:
        worker.stop()
        worker._shutdown()


@pytest.fixture
def queue_without_autovacuum():
    """Autovacuum kept off the queue tables for the test (a transactional one: the setting is
    the tables', and is reset after), so that what the test reads of the queues' statistics
    and dead rows is not changed meanwhile by autovacuum coming round."""
    from django.db import connection

    from delivery.repositories import QUEUE_TABLES

    with connection.cursor() as cursor:
        for table in QUEUE_TABLES:
            cursor.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    yield
    with connection.cursor() as cursor:
        for table in QUEUE_TABLES:
            cursor.execute(f"ALTER TABLE {table} RESET (autovacuum_enabled)")


@pytest.fixture
def chromium() -> str:
    """Debian's chromium's path; the test skips where it could not be installed."""
    if not CHROMIUM.exists():
        pytest.skip(
            f"{CHROMIUM} is not installed and could not be installed here (python3 dev.py test "
            "installs Debian's chromium with apt-get when run as root with apt available, "
            "unless NOTIFYQUEUE_DEV_NO_APT=1)"
        )
    return str(CHROMIUM)
