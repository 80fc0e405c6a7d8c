"""Single creates gathered into one statement while another create statement of the process
runs (notifications/combiner.py, `CreateCombiner`): each create is still its own, with its
own content, client, API key, idempotency answer and error."""

from __future__ import annotations

import http.client
import json
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager

import psycopg
import pytest
from django.db import connection, connections, transaction
from rest_framework.test import APIClient

from clients import authentication
from clients.models import ClientAPIKey
from notifications.models import Notification
from notifications.repositories import CREATE_COMBINER
from tests.support.gunicorn_server import gunicorn_environment, gunicorn_serving

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/api/v1/notifications"


def body(text: str) -> dict:
    return {"channel": "email", "recipient": f"{text}@example.com", "body": text}


@contextmanager
def client_row_held(database_url: str, client_id):
    """The client's row locked FOR UPDATE by another connection: a create's insert goes
    through, and its commit (the deferred foreign key's FOR KEY SHARE) waits until this ends."""
    with psycopg.connect(database_url) as other:
        other.execute("SELECT 1 FROM clients_client WHERE id = %s FOR UPDATE", [client_id])
        with psycopg.connect(database_url, autocommit=True) as watcher:
            yield watcher
        other.rollback()


# Backends waiting for a lock (the held create's commit).
LOCK_WAITS = "SELECT count(*) FROM pg_locks WHERE NOT granted"


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.005)


def created_while_one_is_held(
    database_url: str,
    held_client_id,
    requests: list[tuple[str, str, dict]],
    meanwhile: Callable[[], None] = lambda: None,
) -> list[tuple[int, dict]]:
    """POSTs each (API key, idempotency key, body) from its own thread and connection: the
    first create's statement is held at its commit (its client's row locked), the others are
    sent once it waits there and wait in the process's combiner; then `meanwhile()` runs and
    the hold ends. Returns (status, answer) per request, in order."""
    results: list = [None] * len(requests)
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            results[i] = post_one(*requests[i])
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(requests))]
    with client_row_held(database_url, held_client_id) as holder:
        threads[0].start()
        wait_for(lambda: holder.execute(LOCK_WAITS).fetchone()[0] == 1, "the first commit")
        for thread in threads[1:]:
            thread.start()
        wait_for(lambda: CREATE_COMBINER.waiting() == len(requests) - 1, "the others to wait")
        meanwhile()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert not any(thread.is_alive() for thread in threads)
    return results


def post_one(api_key: str, key: str, data: dict) -> tuple[int, dict]:
    http = APIClient()
    http.credentials(HTTP_AUTHORIZATION=f"Api-Key {api_key}")
    response = http.post(URL, data, format="json", HTTP_IDEMPOTENCY_KEY=key)
    return response.status_code, response.json()


def remembered(api_key: str) -> None:
    """The API key authenticated once by this process: its next creates go the thin way, one
    checked statement each."""
    assert post_one(api_key, "warm-up", body("warm"))[0] == 201


def created_at(client, key: str):
    return Notification.objects.get(client=client, idempotency_key=key).created_at


def test_creates_that_wait_behind_a_statement_go_in_one_statement_each_with_its_content(
    acme, make_client, database_url
):
    beta = make_client("beta")
    remembered(acme[1])
    remembered(beta[1])
    requests = [(acme[1], "k-0", body("first"))] + [
        ((acme, beta)[i % 2][1], f"k-{i}", body(f"user{i}")) for i in range(1, 6)
    ]
    results = created_while_one_is_held(database_url, acme[0].id, requests)

    assert [status for status, _ in results] == [201] * 6
    for i, ((_, key, data), (_, answer)) in enumerate(zip(requests, results, strict=True)):
        client = (acme, beta)[i % 2][0]
        row = Notification.objects.get(client=client, idempotency_key=key)
        assert (str(row.id), answer["recipient"]) == (answer["id"], data["recipient"])
        assert (row.recipient, row.body) == (data["recipient"], data["body"])
    # One statement for the five that waited: they share its clock, the first has its own.
    times = {created_at((acme, beta)[i % 2][0], f"k-{i}") for i in range(1, 6)}
    assert len(times) == 1
    assert created_at(acme[0], "k-0") not in times


def test_creates_with_one_key_in_one_statement_make_one_row_and_answer_as_replays(
    acme, database_url
):
    remembered(acme[1])
    same, other = body("same"), body("other")
    requests = [(acme[1], "k-0", body("first"))] + [
        (acme[1], "dup", data) for data in (same, same, other, same)
    ]
    results = created_while_one_is_held(database_url, acme[0].id, requests)

    row = Notification.objects.get(client=acme[0], idempotency_key="dup")
    answers = results[1:]
    assert Counter(status for status, _ in answers)[201] == 1
    for (_, _, data), (status, answer) in zip(requests[1:], answers, strict=True):
        if data["body"] == row.body:
            assert status in (200, 201)
            assert answer["id"] == str(row.id)
        else:
            assert (status, answer["error"]["code"]) == (409, "idempotency_key_reused")
    assert Notification.objects.filter(idempotency_key="dup").count() == 1


def test_a_key_revoked_while_its_create_waits_creates_nothing_and_spares_the_others(
    acme, make_client, database_url
):
    beta = make_client("beta")
    remembered(acme[1])
    remembered(beta[1])
    requests = [
        (acme[1], "k-0", body("first")),
        (beta[1], "k-1", body("beta1")),
        (acme[1], "k-2", body("acme2")),
        (beta[1], "k-3", body("beta3")),
    ]

    def revoke_beta() -> None:
        ClientAPIKey.objects.filter(client=beta[0]).update(revoked=True)

    results = created_while_one_is_held(database_url, acme[0].id, requests, revoke_beta)

    assert [status for status, _ in results] == [201, 401, 201, 401]
    assert not Notification.objects.filter(client=beta[0]).exclude(idempotency_key="warm-up")
    assert Notification.objects.filter(client=acme[0], idempotency_key="k-2").exists()
    assert authentication.remembered_key(beta[1].partition(".")[0]) is None


def test_a_gathered_create_that_waits_on_another_transaction_holds_up_no_other_client(
    acme, make_client, database_url
):
    """A create whose key another transaction is inserting waits for that transaction. In a
    gathered statement it gives up after the function's lock_timeout (migration notifications
    0017), and every create in it goes alone: the other client's are answered while that
    transaction is still open."""
    beta, gamma = make_client("beta"), make_client("gamma")
    for _, api_key in (acme, beta, gamma):
        remembered(api_key)
    prefix, hashed = ClientAPIKey.objects.filter(client=acme[0]).values_list(
        "prefix", "hashed_key"
    )[0]
    requests = [
        (gamma[1], "k-0", body("first")),  # held at its commit: the others gather behind it
        (acme[1], "taken", body("acme")),
        (beta[1], "k-1", body("beta1")),
        (beta[1], "k-2", body("beta2")),
    ]
    results: list = [None] * len(requests)

    def one(i: int) -> None:
        try:
            results[i] = post_one(*requests[i])
        finally:
            connections.close_all()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(requests))]
    with psycopg.connect(database_url) as inserting:
        # Another transaction inserts acme's key "taken" and stays open.
        inserting.execute(
            "SELECT notification_create_checked(%s, 'taken', 'other', 'email', "
            "'x@example.com', '', 'b', 1, '{}', NULL, NULL, NULL, '[]', NULL, NULL, 5, %s, %s, "
            "NULL, NULL, NULL)",
            [acme[0].id, prefix, hashed],
        )
        with client_row_held(database_url, gamma[0].id) as watcher:
            threads[0].start()
            wait_for(lambda: watcher.execute(LOCK_WAITS).fetchone()[0] == 1, "the commit")
            for thread in threads[1:]:
                thread.start()
            wait_for(lambda: CREATE_COMBINER.waiting() == 3, "the others to wait")
        for thread in threads[2:]:
            thread.join(10)
        beta_answers = [results[i] and results[i][0] for i in (2, 3)]
        assert beta_answers == [201, 201], "beta's creates waited for acme's open insert"
        assert threads[1].is_alive(), "acme's create did not wait for the open insert"
        inserting.rollback()
    for thread in threads:
        thread.join(30)
    assert [status for status, _ in results] == [201, 201, 201, 201]


@pytest.fixture
def poison_body():
    """A table rule the API does not check: a row whose body is 'poison' breaks it."""
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION test_poison() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "RAISE EXCEPTION 'poison' USING ERRCODE = 'check_violation'; END $$; "
            "CREATE TRIGGER test_poison BEFORE INSERT ON notification FOR EACH ROW "
            "WHEN (NEW.body = 'poison') EXECUTE FUNCTION test_poison();"
        )
    yield
    with connection.cursor() as cursor:
        cursor.execute("DROP TRIGGER test_poison ON notification; DROP FUNCTION test_poison();")


def test_a_create_that_fails_the_gathered_statement_fails_alone(acme, database_url, poison_body):
    remembered(acme[1])
    requests = [
        (acme[1], "k-0", body("first")),
        (acme[1], "k-1", body("fine1")),
        (acme[1], "k-2", body("poison")),
        (acme[1], "k-3", body("fine3")),
    ]
    results = created_while_one_is_held(database_url, acme[0].id, requests)

    assert [status for status, _ in results] == [201, 201, 400, 201]
    assert "breaks a table rule" in results[2][1]["error"]["message"]
    keys = set(
        Notification.objects.filter(client=acme[0]).values_list("idempotency_key", flat=True)
    )
    assert keys == {"warm-up", "k-0", "k-1", "k-3"}
    # Sent again one by one: each has its own statement's clock.
    assert created_at(acme[0], "k-1") != created_at(acme[0], "k-3")


def test_a_create_inside_a_transaction_is_sent_on_its_own_connection(
    acme, make_client, database_url
):
    """A row written in a transaction belongs to it: it never waits in the combiner to be sent
    by another thread's connection. With another create of the process held at its commit,
    a create inside `atomic` is answered at once, and the transaction's rollback removes it."""
    gamma = make_client("gamma")
    remembered(acme[1])
    remembered(gamma[1])
    outcome: list = []

    def held() -> None:
        try:
            post_one(gamma[1], "held", body("held"))
        finally:
            connections.close_all()

    def inside() -> None:
        try:
            with transaction.atomic():
                outcome.append(post_one(acme[1], "in", body("inside"))[0])
                transaction.set_rollback(True)
        finally:
            connections.close_all()

    holding, creating = threading.Thread(target=held), threading.Thread(target=inside)
    with client_row_held(database_url, gamma[0].id) as watcher:
        holding.start()
        wait_for(lambda: watcher.execute(LOCK_WAITS).fetchone()[0] == 1, "the held commit")
        creating.start()
        creating.join(10)
        assert outcome == [201], "the create inside a transaction waited for another's statement"
    holding.join(30)
    creating.join(30)
    assert not Notification.objects.filter(idempotency_key="in").exists()


def test_a_process_forked_while_a_create_is_sent_starts_with_nobody_sending(acme):
    """gunicorn forks its workers: a child must not inherit a parent's create in flight, or
    every create of the child would wait for a statement that never ends."""
    CREATE_COMBINER._sending = True  # as while a parent's thread sends a statement
    try:
        pid = os.fork()
        if pid == 0:
            os._exit(0 if CREATE_COMBINER.waiting() == 0 and not CREATE_COMBINER._sending else 1)
        _, status = os.waitpid(pid, 0)
    finally:
        CREATE_COMBINER._sending = False
    assert os.waitstatus_to_exitcode(status) == 0


def post_creates(port: int, api_key: str, requests: list[tuple[str, str]]) -> list[tuple]:
    """POSTs each (idempotency key, text) on one keep-alive connection; (key, text, status,
    answer) for each."""
    answers = []
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        for key, text in requests:
            conn.request(
                "POST",
                URL,
                body=json.dumps(body(text)),
                headers={
                    "Authorization": f"Api-Key {api_key}",
                    "Idempotency-Key": key,
                    "Content-Type": "application/json",
                },
            )
            response = conn.getresponse()
            answers.append((key, text, response.status, json.loads(response.read())))
    finally:
        conn.close()
    return answers


@pytest.mark.slow
def test_creates_under_load_with_the_apis_sessions_killed_keep_one_row_a_key(acme, database_url):
    """gunicorn, one process of eight threads; eight clients create on keep-alive connections
    with 40 keys they share and two bodies (so replays and conflicts meet in gathered
    statements), while another connection terminates the API's database sessions every 50 ms.
    Every answer is 201, 200, 409, or 503 for a request that lost its session, never a 500;
    sent again once the sessions are left alone, each 503 is answered. Each key has one row:
    one 201 names it, every 200 names it with its body, every 409 had another body."""
    keys = [f"shared-{n}" for n in range(40)]
    plans = [
        [(chooser.choice(keys), chooser.choice(("one", "two"))) for _ in range(40)]
        for chooser in map(random.Random, range(8))
    ]
    answers: list[tuple] = []
    failures: list[BaseException] = []
    stop = threading.Event()

    def client(plan: list[tuple[str, str]]) -> None:
        try:
            answers.extend(post_creates(port, acme[1], plan))
        except BaseException as exc:
            failures.append(exc)

    def killer() -> None:
        with psycopg.connect(database_url, autocommit=True) as other:
            while not stop.wait(0.05):
                other.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND backend_type = 'client backend' "
                    "AND pid <> pg_backend_pid() AND pid <> %s",
                    [own_pid],
                )

    connection.ensure_connection()
    own_pid = connection.connection.info.backend_pid  # this test's session
    env = gunicorn_environment(DATABASE_URL=database_url, NOTIFYQUEUE_API_RATE_LIMIT="0")
    with gunicorn_serving(env, workers=1, threads=8) as base:
        port = int(base.rsplit(":", 1)[1])
        clients = [threading.Thread(target=client, args=(plan,)) for plan in plans]
        killing = threading.Thread(target=killer)
        killing.start()
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join(120)
        stop.set()
        killing.join(30)
        lost = [(key, text) for key, text, status, _ in answers if status == 503]
        again = post_creates(port, acme[1], lost)

    assert not failures, failures
    statuses = Counter(status for *_, status, _ in answers)
    assert sum(statuses.values()) == 8 * 40
    assert statuses.keys() <= {200, 201, 409, 503}, statuses
    assert statuses[503], "no session was lost mid-request: nothing was tested"
    assert Counter(status for *_, status, _ in again).keys() <= {200, 201, 409}
    rows = {
        row.idempotency_key: row
        for row in Notification.objects.filter(client=acme[0], idempotency_key__in=keys)
    }
    answered = [answer for answer in answers + again if answer[2] != 503]
    for key, text, status, answer in answered:
        if status in (200, 201):
            assert (answer["id"], rows[key].body) == (str(rows[key].id), text)
        else:
            assert rows[key].body != text
    created = Counter(key for key, _, status, _ in answered if status == 201)
    assert set(created.values()) <= {1}
