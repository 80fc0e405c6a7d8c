"""/metrics under gunicorn with several worker processes reports the whole API.

Real gunicorn (notifyqueue/gunicorn_conf.py, 3 workers) on 127.0.0.1 against the test
database: notifications are created through it while /metrics is scraped many times. Each
scrape lands on whichever process accepts it; every counter must still only grow, and the
created-notifications counter must equal what was created. The request series of a create
(written in batches, monitoring/middleware.py) may lag by FLUSH_EVERY_S, never more, and a
worker that exits writes what it counted.
"""

from __future__ import annotations

import itertools
import json
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest, multiprocess
from prometheus_client.parser import text_string_to_metric_families

from monitoring.middleware import FLUSH_EVERY_S
from tests.support.gunicorn_server import gunicorn_environment, gunicorn_serving

ROOT = Path(__file__).resolve().parents[2]
GUNICORN_WORKERS = 3
ROUNDS = 12
CREATES_PER_ROUND = 3
SCRAPES_PER_ROUND = 4

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def counters(text: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of every counter and histogram (the series that must never go down)."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        if family.type in {"counter", "histogram"}
        for sample in family.samples
        if not sample.name.endswith("_created")
    }


@pytest.fixture
def gunicorn(database_url):
    with gunicorn_serving(
        gunicorn_environment(DATABASE_URL=database_url), workers=GUNICORN_WORKERS
    ) as base:
        yield base


def test_every_counter_is_monotonic_and_true_across_workers(gunicorn, make_client):
    _, key = make_client("acme")
    created = 0
    scrapes = []
    for round_ in range(ROUNDS):
        for n in range(CREATES_PER_ROUND):
            sms_create(gunicorn, key, f"+4477009{round_:02d}{n:03d}", f"k-{round_}-{n}")
            created += 1
        for _ in range(SCRAPES_PER_ROUND):
            with urllib.request.urlopen(f"{gunicorn}/metrics", timeout=10) as response:
                scraped = counters(response.read().decode())
            total = scraped.get(
                ("notifyqueue_notifications_created_total", frozenset({("channel", "sms")}))
            )
            assert total == created, f"scrape {len(scrapes)}: {total} != {created}"
            assert posts(scraped) <= created
            scrapes.append(scraped)

    for before, after in itertools.pairwise(scrapes):
        went_down = {
            series: (value, after.get(series))
            for series, value in before.items()
            if after.get(series, 0.0) < value
        }
        assert not went_down

    # Every process writes what it counted within FLUSH_EVERY_S, whichever answers the scrape.
    deadline = time.monotonic() + FLUSH_EVERY_S + 5
    while posts(scrapes[-1]) != created and time.monotonic() < deadline:
        time.sleep(0.1)
        with urllib.request.urlopen(f"{gunicorn}/metrics", timeout=10) as response:
            scrapes.append(counters(response.read().decode()))
    assert posts(scrapes[-1]) == created


def test_a_worker_that_exits_writes_the_requests_it_counted(database_url, make_client, tmp_path):
    """Creates spread over the workers, then gunicorn stopped at once (SIGTERM: each worker
    finishes and exits): the request series in the metrics folder count every create, though
    no flush was due and nothing scraped."""
    _, key = make_client("acme")
    env = gunicorn_environment(DATABASE_URL=database_url, PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    creates = 30
    with gunicorn_serving(env, workers=GUNICORN_WORKERS) as base:
        for n in range(creates):
            sms_create(base, key, "+447700900123", f"exit-{n}")
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(tmp_path))
    assert posts(counters(generate_latest(registry).decode())) == creates


def sms_create(base: str, api_key: str, recipient: str, idempotency_key: str) -> None:
    request = urllib.request.Request(
        f"{base}/api/v1/notifications",
        data=json.dumps({"channel": "sms", "recipient": recipient, "body": "hi"}).encode(),
        headers={
            "Authorization": f"Api-Key {api_key}",
            "Idempotency-Key": idempotency_key,
            "Content-Type": "application/json",
        },
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 201


def posts(scraped: dict[tuple[str, frozenset], float]) -> float:
    return scraped.get(
        ("django_http_requests_total_by_method_total", frozenset({("method", "POST")})), 0.0
    )
