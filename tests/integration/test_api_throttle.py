"""The per-client API throttle: 429 with Retry-After past the rate, counted in
PostgreSQL so every API process shares one count, in windows of the database's clock."""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from rest_framework.test import APIClient

from clients.models import ClientRequestWindow
from clients.throttling import RequestBudget, block_size
from tests.support.clock import DbClock, database_now

URL = "/api/v1/notifications"


@pytest.fixture
def limited(settings):
    """3 requests a minute, the database's clock frozen mid-window: windows are whole minutes
    of that clock, so a test crossing one at its real time would start a second count."""
    settings.NOTIFYQUEUE_API_RATE_LIMIT = 3
    settings.NOTIFYQUEUE_API_RATE_LIMIT_WINDOW_SECONDS = 60
    DbClock(database_now().replace(second=30, microsecond=0))


def as_client(key: str) -> APIClient:
    http = APIClient()
    http.credentials(HTTP_AUTHORIZATION=f"Api-Key {key}")
    return http


@pytest.mark.django_db
def test_past_the_rate_a_client_gets_429_with_retry_after_in_the_json_format(limited, api):
    assert [api.get(URL).status_code for _ in range(3)] == [200, 200, 200]
    refused = api.get(URL)
    assert refused.status_code == 429
    assert 1 <= int(refused["Retry-After"]) <= 60
    assert refused.json()["error"]["code"] == "throttled"


@pytest.mark.django_db
def test_one_clients_requests_never_spend_anothers(limited, api, make_client):
    for _ in range(4):
        api.get(URL)
    _, other_key = make_client("other")
    assert as_client(other_key).get(URL).status_code == 200


@pytest.mark.django_db
def test_a_new_window_of_the_database_clock_starts_the_count_again(limited, api):
    clock = DbClock()
    for _ in range(4):
        api.get(URL)
    refused = api.get(URL)
    assert refused.status_code == 429
    # Retry-After is the rest of the window on the database's clock.
    clock.advance(int(refused["Retry-After"]))
    assert api.get(URL).status_code == 200


@pytest.mark.django_db
def test_the_counter_table_is_unlogged_so_counting_never_waits_for_a_wal_flush():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT relpersistence FROM pg_class WHERE relname = 'clients_request_window'"
        )
        assert cursor.fetchone() == ("u",)


@pytest.mark.django_db
def test_unauthenticated_requests_are_not_counted(limited, acme):
    for _ in range(5):
        assert APIClient().get(URL).status_code == 401
    assert not ClientRequestWindow.objects.exists()


@pytest.mark.django_db
def test_zero_turns_the_throttle_off(settings, api):
    settings.NOTIFYQUEUE_API_RATE_LIMIT = 0
    assert all(api.get(URL).status_code == 200 for _ in range(5))
    assert not ClientRequestWindow.objects.exists()


@pytest.mark.django_db
def test_a_client_has_one_counter_row_however_many_requests(settings, api, acme):
    settings.NOTIFYQUEUE_API_RATE_LIMIT = 1000
    for _ in range(20):
        api.get(URL)
    row = ClientRequestWindow.objects.get()
    assert (row.client_id, row.requests) == (acme[0].id, 20)


@pytest.mark.django_db(transaction=True)
def test_requests_served_on_other_connections_share_one_count(limited, acme):
    """Each thread has its own database connection, as each gunicorn process does: the
    count is the database's, so the fourth request is refused whichever serves it."""
    answers: list[int] = []

    def one_request() -> None:
        try:
            answers.append(as_client(acme[1]).get(URL).status_code)
        finally:
            connection.close()

    for _ in range(4):
        worker = threading.Thread(target=one_request)
        worker.start()
        worker.join()
    assert answers == [200, 200, 200, 429]


@pytest.mark.django_db
def test_at_a_large_limit_a_process_reserves_requests_in_blocks(settings, api, acme):
    settings.NOTIFYQUEUE_API_RATE_LIMIT = 60_000
    assert block_size(60_000) == 58
    assert all(api.get(URL).status_code == 200 for _ in range(10))
    # One statement reserved 58; the next nine came from that block, without a statement.
    assert ClientRequestWindow.objects.get(client=acme[0]).requests == 58


@pytest.mark.django_db
def test_blocks_of_several_processes_never_admit_more_than_the_limit(acme):
    """Three processes (each its own RequestBudget, as each gunicorn process has one) share
    the client's count in PostgreSQL: at most the limit is admitted, and refusals start no
    earlier than limit - processes x (block - 1)."""
    limit, block = 100, 8
    processes = [RequestBudget(block=lambda _limit: block) for _ in range(3)]
    admitted = 0
    first_refusal_after = None
    for n in range(200):
        wait = processes[(n * 7) % 3].refused(acme[0].id, limit=limit, window_s=3600)
        if wait is None:
            admitted += 1
        else:
            assert 0 < wait <= 3600
            if first_refusal_after is None:
                first_refusal_after = admitted
    assert admitted <= limit
    assert first_refusal_after >= limit - len(processes) * (block - 1)
