"""The WSGI shortcut for the create endpoints (notifyqueue/serving/shortcuts.py) answers
exactly as the long way does: Django's handler, every middleware, the URL's view.

Requests go to a `ShortcutApplication` built as notifyqueue/wsgi.py builds it, through
werkzeug's WSGI test client (what schemathesis drives too), with the Django application under
it counted, so each test knows which way a request went. `Accept: application/json; q=1` sends
a request the long way (the thin path does not take it) for an answer to compare with.
Transactional: the shortcut closes an unusable or obsolete connection as a request ends, as
Django does, which a test's enclosing transaction would not survive.
"""

from __future__ import annotations

import json
import logging
import time

import pytest
from django.core.handlers.wsgi import WSGIHandler
from django.db import connection
from django_prometheus.middleware import Metrics
from prometheus_client import REGISTRY
from werkzeug.test import Client

from monitoring.middleware import FLUSH_EVERY_S, flush_request_metrics
from notifications import repositories, services
from notifications.views import api_shortcuts
from notifyqueue.serving.shortcuts import ShortcutApplication
from tests.integration.test_api_thin_path import BATCH_URL, URL, VALID

pytestmark = pytest.mark.django_db(transaction=True)

LONG_WAY = {"Accept": "application/json; q=1"}


class Counted:
    """Django's WSGI application, counting the requests it is given. Made at the first request,
    after any settings a test changed (its middleware reads them when made)."""

    def __init__(self) -> None:
        self.calls = 0
        self.app: WSGIHandler | None = None

    def __call__(self, environ, start_response):
        self.calls += 1
        if self.app is None:
            self.app = WSGIHandler()
        return self.app(environ, start_response)


@pytest.fixture
def long_way() -> Counted:
    return Counted()


@pytest.fixture
def http(long_way):
    """POSTs JSON (or GETs) through a shortcut application made at the first request."""
    clients = []

    def post(url, body, *, key="", api_key="", headers=None, raw=None, method="POST"):
        if not clients:
            clients.append(Client(ShortcutApplication(long_way, api_shortcuts())))
        sent = {"Content-Type": "application/json", "Authorization": f"Api-Key {api_key}"}
        if key:
            sent["Idempotency-Key"] = key
        sent.update(headers or {})
        if method == "GET":
            return clients[0].get(url, headers=sent)
        data = raw if raw is not None else json.dumps(body).encode()
        return clients[0].post(url, data=data, headers=sent)

    return post


def same_answer(shortcut, long) -> None:
    assert shortcut.status_code == long.status_code, (shortcut.data, long.data)
    assert shortcut.data == long.data
    assert sorted(shortcut.headers.items()) == sorted(long.headers.items())


def test_a_create_goes_the_shortcut_and_answers_as_the_long_way(http, long_way, make_client):
    _, key = make_client()
    created = http(URL, VALID, key="k-1", api_key=key)
    assert created.status_code == 201
    assert long_way.calls == 0
    replay = http(URL, VALID, key="k-1", api_key=key)
    assert replay.status_code == 200 and replay.data == created.data
    assert long_way.calls == 0
    same_answer(replay, http(URL, VALID, key="k-1", api_key=key, headers=LONG_WAY))
    assert long_way.calls == 1


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"metadata": {"z": 1, "a": [1.5, None, True], "big": 2**70, "e": 1e-7, "huge": 1e300}},
        {"send_at": "2030-01-02T03:04:05.123456+02:00", "priority": "low"},
        {"send_at": "2001-01-01T00:00:00Z"},
        {"delay_seconds": 3600, "metadata": {}},
    ],
    ids=["plain", "rich metadata", "later", "past", "delayed"],
)
def test_a_checked_creates_answer_is_the_row_as_stored(http, make_client, monkeypatch, fields):
    # The checked create (a key the process knows) answers from what was sent and the columns
    # the database chose or rewrote: it must read as the stored row does, and as its replay.
    _, key = make_client()
    assert http(URL, VALID, key="k-0", api_key=key).status_code == 201  # the key remembered
    checked = []
    monkeypatch.setattr(
        repositories,
        "_insert_checked",
        lambda *args, real=repositories._insert_checked: checked.append(1) or real(*args),
    )
    body = {key: value for key, value in VALID.items() if key != "send_at"} | fields
    created = http(URL, body, key="k-1", api_key=key)
    assert (created.status_code, checked) == (201, [1])
    stored = http(f"{URL}/{created.json['id']}", None, api_key=key, method="GET")
    assert created.json == stored.json
    replay = http(URL, body, key="k-1", api_key=key)
    assert (replay.status_code, replay.json) == (200, stored.json)


def test_a_checked_create_after_a_reconnection_uses_the_new_connection(
    http, make_client, monkeypatch
):
    _, key = make_client()
    assert http(URL, VALID, key="k-0", api_key=key).status_code == 201  # the key remembered
    outcomes = []

    def checked(*args, real=repositories._insert_checked):
        try:
            record = real(*args)
        except Exception as exc:
            outcomes.append(type(exc).__name__)
            raise
        outcomes.append(type(record).__name__)
        return record

    monkeypatch.setattr(repositories, "_insert_checked", checked)
    assert http(URL, VALID, key="k-1", api_key=key).status_code == 201
    connection.close()
    assert http(URL, VALID, key="k-2", api_key=key).status_code == 201
    assert outcomes == ["NotificationRecord", "NotificationRecord"]


def test_a_batch_goes_the_shortcut_and_answers_as_the_long_way(http, long_way, make_client):
    _, key = make_client()
    items = [
        {**VALID, "idempotency_key": "b-1"},
        {**VALID, "idempotency_key": "b-2", "channel": "fax"},
        {**VALID, "idempotency_key": "b-1"},
    ]
    created = http(BATCH_URL, {"notifications": items}, api_key=key)
    assert [r["status"] for r in created.json["results"]] == [201, 400, 200]
    assert long_way.calls == 0
    same_answer(
        http(BATCH_URL, {"notifications": items}, api_key=key),
        http(BATCH_URL, {"notifications": items}, api_key=key, headers=LONG_WAY),
    )


@pytest.mark.parametrize(
    ("body", "raw"),
    [
        ({**VALID, "channel": "fax"}, None),
        ({**VALID, "colour": "red"}, None),
        (None, b'{"channel": "email", "body": "a\\u0000b"}'),
        (None, b'{"channel": '),
    ],
    ids=["bad channel", "unknown field", "NUL escape", "truncated JSON"],
)
def test_a_request_the_thin_path_gives_back_goes_the_long_way_with_its_body(
    http, long_way, make_client, body, raw
):
    _, key = make_client()
    shortcut = http(URL, body, key="k-1", api_key=key, raw=raw)
    assert long_way.calls == 1  # given back, with the body the shortcut had read
    assert shortcut.status_code == 400
    same_answer(shortcut, http(URL, body, key="k-1", api_key=key, raw=raw, headers=LONG_WAY))


@pytest.mark.parametrize(
    "api_key",
    ["nope.nope", "", "é.é"],
    ids=["unknown key", "no key", "not ASCII"],
)
def test_a_bad_api_key_on_a_valid_create_is_refused_by_the_shortcut_as_the_long_way_does(
    http, long_way, make_client, api_key
):
    make_client()
    refused = http(URL, VALID, key="k-1", api_key=api_key)
    assert refused.status_code == 401 and long_way.calls == 0  # authenticated once, here
    same_answer(refused, http(URL, VALID, key="k-1", api_key=api_key, headers=LONG_WAY))
    assert long_way.calls == 1


def test_the_api_guards_refusals_are_made_the_long_way(http, long_way, make_client, settings):
    _, key = make_client()
    nul = http(URL, VALID, key="k-1", api_key=key, headers={"X-Note": "a\x00b"})
    assert nul.status_code == 400 and long_way.calls == 1
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10
    too_big = http(URL, VALID, key="k-2", api_key=key)
    assert too_big.status_code == 413 and long_way.calls == 2
    assert too_big.json["error"]["code"] == "payload_too_large"


def test_plain_http_is_redirected_to_https_the_long_way(http, long_way, make_client, settings):
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    settings.SECURE_HSTS_SECONDS = 3600
    _, key = make_client()
    redirected = http(URL, VALID, key="k-1", api_key=key)
    assert redirected.status_code == 301 and long_way.calls == 1
    https = {"X-Forwarded-Proto": "https"}
    created = http(URL, VALID, key="k-1", api_key=key, headers=https)
    assert created.status_code == 201 and long_way.calls == 1
    assert created.headers["Strict-Transport-Security"].startswith("max-age=3600")
    same_answer(
        http(URL, VALID, key="k-1", api_key=key, headers=https),
        http(URL, VALID, key="k-1", api_key=key, headers={**https, **LONG_WAY}),
    )


def test_an_exception_is_answered_as_django_answers_it(http, make_client, monkeypatch, caplog):
    _, key = make_client()

    def broken(**kwargs):
        raise RuntimeError("the service broke")

    monkeypatch.setattr(services, "notification_create", broken)
    with caplog.at_level(logging.ERROR, logger="django.request"):
        shortcut = http(URL, VALID, key="k-1", api_key=key)
        long = http(URL, VALID, key="k-1", api_key=key, headers=LONG_WAY)
    assert shortcut.status_code == 500
    assert shortcut.json["error"]["code"] == "server_error"
    same_answer(shortcut, long)
    logged = [r for r in caplog.records if r.name == "django.request"]
    assert len(logged) == 2 and all(r.exc_info[0] is RuntimeError for r in logged)


def test_the_request_metrics_are_recorded_as_django_prometheus_records_them(http, make_client):
    _, key = make_client()
    metrics = Metrics.get_instance()
    by_view = metrics.responses_by_status_view_method.labels(
        status="201", view="notification-list", method="POST"
    )
    latency = metrics.requests_latency_by_view_method.labels(
        view="notification-list", method="POST"
    )

    def observed() -> float:
        return {sample.name: sample.value for sample in latency._samples()}["_count"]

    def values() -> tuple[float, float, float]:
        return by_view._value.get(), metrics.requests_total._value.get(), observed()

    flush_request_metrics()
    before = values()
    assert http(URL, VALID, key="k-1", api_key=key).status_code == 201
    flush_request_metrics()
    after = values()
    assert [b - a for a, b in zip(before, after, strict=True)] == [1, 1, 1]


def test_the_request_metrics_are_written_within_a_second_without_a_scrape(http, make_client):
    """The shortcut counts a request in memory; the process's own thread writes it to
    prometheus_client's values within FLUSH_EVERY_S, whether or not anything reads them."""
    _, key = make_client()
    requests_total = Metrics.get_instance().requests_total
    flush_request_metrics()
    before = requests_total._value.get()
    assert http(URL, VALID, key="k-1", api_key=key).status_code == 201
    assert http(URL, VALID, key="k-2", api_key=key).status_code == 201
    deadline = time.monotonic() + FLUSH_EVERY_S + 2
    while requests_total._value.get() < before + 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert requests_total._value.get() == before + 2


def _request_series() -> dict[tuple, float]:
    """django-prometheus' request counters and histogram counts, by name and labels."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for metric in REGISTRY.collect()
        if metric.name.startswith("django_http_")
        for sample in metric.samples
        if sample.name.endswith(("_total", "_count"))
    }


def test_a_shortcut_answer_counts_in_every_series_the_long_way_counts_in(http, make_client):
    _, key = make_client()

    def counted(**headers) -> dict[tuple, float]:
        flush_request_metrics()
        before = _request_series()
        assert (
            http(URL, VALID, key=f"k-{len(headers)}", api_key=key, headers=headers).status_code
            == 201
        )
        flush_request_metrics()
        after = _request_series()
        return {
            name: after[name] - before.get(name, 0)
            for name in after
            if after[name] != before.get(name, 0)
        }

    by_the_long_way = counted(**LONG_WAY)
    by_the_shortcut = counted()
    assert by_the_shortcut == by_the_long_way
    assert (
        ("django_http_responses_total_by_charset_total", (("charset", "utf-8"),))
    ) in by_the_shortcut


def test_an_obsolete_connection_is_closed_as_the_request_ends(http, make_client):
    _, key = make_client()
    assert http(URL, VALID, key="k-1", api_key=key).status_code == 201
    assert connection.connection is not None
    connection.close_at = time.monotonic() - 1  # older than CONN_MAX_AGE
    assert http(URL, VALID, key="k-2", api_key=key).status_code == 201
    assert connection.connection is None
    assert http(URL, VALID, key="k-3", api_key=key).status_code == 201
