"""The API's edges under the real server: gunicorn with several worker processes on 127.0.0.1
against the test database.

- the throttle's count is shared by every process (it lives in PostgreSQL);
- an oversized body is a 413 in the JSON format before it is read;
- the server's own refusal of a long URL (414) is a status the schema documents.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from tests.support.gunicorn_server import gunicorn_environment, gunicorn_serving

ROOT = Path(__file__).resolve().parents[2]
GUNICORN_WORKERS = 3
RATE_LIMIT = 6

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def server(database_url):
    env = gunicorn_environment(
        DATABASE_URL=database_url,
        NOTIFYQUEUE_API_RATE_LIMIT=str(RATE_LIMIT),
        NOTIFYQUEUE_API_RATE_LIMIT_WINDOW_SECONDS="3600",
    )
    with gunicorn_serving(env, workers=GUNICORN_WORKERS) as base:
        yield int(base.rsplit(":", 1)[1])


def get(port: int, path: str, key: str) -> tuple[int, dict, dict]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        headers={"Authorization": f"Api-Key {key}", "Connection": "close"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), json.loads(response.read())
    except urllib.error.HTTPError as refused:
        body = refused.read()
        return refused.code, dict(refused.headers), json.loads(body) if body[:1] == b"{" else {}


def post_head_only(port: int, path: str, headers: dict[str, str]) -> tuple[int, dict]:
    """Sends a POST's head, declaring a body it never sends, and reads the answer."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.putrequest("POST", path)
        for name, value in headers.items():
            conn.putheader(name, value)
        conn.endheaders()
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_the_throttle_counts_once_across_every_server_process(server, make_client):
    _, key = make_client("acme")
    answers = [get(server, "/api/v1/notifications", key) for _ in range(RATE_LIMIT + 3)]
    assert [status for status, _, _ in answers] == [200] * RATE_LIMIT + [429] * 3
    _, headers, body = answers[-1]
    assert 1 <= int(headers["Retry-After"]) <= 3600
    assert body["error"]["code"] == "throttled"


def test_an_oversized_body_is_refused_with_413_json_before_it_is_read(server, make_client):
    _, key = make_client("acme")
    status, body = post_head_only(
        server,
        "/api/v1/notifications",
        {
            "Authorization": f"Api-Key {key}",
            "Idempotency-Key": "big",
            "Content-Type": "application/json",
            "Content-Length": "50000000",
        },
    )
    assert status == 413
    assert body["error"]["code"] == "payload_too_large"


def test_the_servers_414_for_a_long_url_is_documented(server, make_client):
    _, key = make_client("acme")
    status, _, _ = get(server, "/api/v1/notifications?recipient=" + "a" * 5000, key)
    assert status == 414
    schema = APIClient().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    operation = schema.json()["paths"]["/api/v1/notifications"]["get"]
    assert "414" in operation["responses"]
