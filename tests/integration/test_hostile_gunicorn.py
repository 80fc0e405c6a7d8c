"""One hostile client against the API as production runs it (gunicorn, two processes of two
threads, the test database): creates with a template that would expand to a gigabyte, sent
back to back from four connections, while another client creates plain notifications."""

from __future__ import annotations

import json
import statistics
import threading
import time
import urllib.error
import urllib.request

import pytest

from notifications.models import Notification
from tests.support.gunicorn_server import gunicorn_environment, gunicorn_serving

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

HOSTILE_S = 3.0


def post(base: str, path: str, key: str, body: dict, idempotency_key: str, method="POST"):
    request = urllib.request.Request(
        f"{base}{path}",
        data=json.dumps(body).encode(),
        method=method,
        headers={
            "Authorization": f"Api-Key {key}",
            "Content-Type": "application/json",
            "Idempotency-Key": idempotency_key,
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


def test_template_bombs_are_refused_fast_and_do_not_hold_up_another_client(
    make_client, database_url
):
    _, hostile = make_client("hostile")
    _, ordinary = make_client("ordinary")
    env = gunicorn_environment(DATABASE_URL=database_url, NOTIFYQUEUE_API_RATE_LIMIT="0")
    with gunicorn_serving(env, workers=2, threads=2) as base:
        status, _ = post(
            base,
            "/api/v1/templates/bomb/email",
            hostile,
            {"subject": "s", "body": "{a}" * 21_845},
            "",
            method="PUT",
        )
        assert status == 201
        bomb = {
            "channel": "email",
            "recipient": "ada@example.com",
            "template": "bomb",
            "payload": {"a": "x" * 65_000},
        }
        refusals: list[float] = []
        ends = time.monotonic() + HOSTILE_S

        def attack(thread: int) -> None:
            n = 0
            while time.monotonic() < ends:
                started = time.monotonic()
                status, answer = post(
                    base, "/api/v1/notifications", hostile, bomb, f"b-{thread}-{n}"
                )
                assert status == 400 and "payload" in answer["error"]["fields"], answer
                refusals.append(time.monotonic() - started)
                n += 1

        attackers = [threading.Thread(target=attack, args=(t,)) for t in range(4)]
        for attacker in attackers:
            attacker.start()
        plain: list[float] = []
        n = 0
        while time.monotonic() < ends:
            started = time.monotonic()
            status, _ = post(
                base,
                "/api/v1/notifications",
                ordinary,
                {"channel": "email", "recipient": "bob@example.com", "body": "Receipt"},
                f"o-{n}",
            )
            assert status == 201
            plain.append(time.monotonic() - started)
            n += 1
        for attacker in attackers:
            attacker.join()

    assert len(refusals) >= 8 and len(plain) >= 5
    assert statistics.median(refusals) < 1.0, sorted(refusals)[-5:]
    assert max(plain) < 2.0, sorted(plain)[-5:]
    assert set(Notification.objects.values_list("recipient", flat=True)) == {"bob@example.com"}
