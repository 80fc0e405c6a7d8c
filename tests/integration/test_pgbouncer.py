"""Workers and the API through PgBouncer in transaction-pooling mode.

A real PgBouncer (Debian's package; `python3 dev.py test` installs it) on 127.0.0.1 in front
of the test database with `pool_mode = transaction` and three server connections for many
more clients. It is stricter than a production PgBouncer: it runs `DISCARD ALL` after every
transaction (`server_reset_query_always`), so any session state a process leaves behind
(a prepared statement, a WITH HOLD cursor, a session advisory lock, a LISTEN, a SET) is gone
before its next transaction, every time, not only when that transaction happens to land on
another server connection. Where PgBouncer knows `max_prepared_statements` (1.21+), it is 0.

- Three `run_worker` processes with DATABASE_URL through it and their LISTEN connection
  direct (NOTIFYQUEUE_LISTEN_DATABASE_URL) deliver a few hundred notifications, several per
  recipient under a low rate limit (admission under pg_advisory_xact_lock, deferrals),
  retries, permanent failures and dead letters, with their webhooks: the universal check
  holds (the rate limit checked exactly, on the database's admission times), every
  notification ends as its recipient says, their logs show no database error, PgBouncer
  never opened more than its three server connections, and the three LISTEN sessions are the
  direct ones all along.
- gunicorn with DATABASE_URL through it answers creates, batch, reads, list, cancel, retries,
  templates, preferences, /status, /metrics and the admin's pages, never a 500.
"""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.db import connection

from delivery.models import DeliveryAttempt
from notifications.models import Notification, Status
from tests.faults.harness import (
    Workers,
    all_final,
    notifications_create,
    universal_check,
    wait_until,
)
from tests.support.factories import ClientFactory, NotificationFactory
from tests.support.gunicorn_server import free_port, gunicorn_environment, gunicorn_serving
from tests.support.http_servers import ScriptedProvider
from tests.support.webhook_receiver import WebhookReceiver

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
SERVER_CONNECTIONS = 3
LIMIT, WINDOW_S = 3, 2.0
# What a database problem looks like in a worker's or gunicorn's log: psycopg's and Django's
# error classes, and PostgreSQL's words for lost session state.
DATABASE_ERROR = re.compile(
    r"psycopg|OperationalError|ProgrammingError|InterfaceError|InternalError|DatabaseError|"
    r"prepared statement|does not exist|server closed|pgbouncer|Traceback",
    re.IGNORECASE,
)


@contextmanager
def pgbouncer_serving(tmp_path: Path) -> Iterator[str]:
    """PgBouncer in transaction mode in front of the test database; yields its URL."""
    if not Path(PGBOUNCER).exists():
        pytest.skip(
            "pgbouncer is not installed and could not be installed here (python3 dev.py test "
            "installs Debian's pgbouncer with apt-get when run as root with apt available, "
            "unless NOTIFYQUEUE_DEV_NO_APT=1)"
        )
    s = connection.settings_dict
    host, port = s["HOST"] or "localhost", s["PORT"] or "5432"
    server = f"host={host} port={port} dbname={s['NAME']} user={s['USER']}"
    if s["PASSWORD"]:
        server += f" password='{s['PASSWORD']}'"
    folder = tmp_path / "pgbouncer"
    folder.mkdir()
    (folder / "userlist.txt").write_text(f'"{s["USER"]}" ""\n')
    settings = {
        "listen_addr": "127.0.0.1",
        "unix_socket_dir": "",
        "pidfile": "",
        "auth_type": "trust",
        "auth_file": str(folder / "userlist.txt"),
        "pool_mode": "transaction",
        "default_pool_size": str(SERVER_CONNECTIONS),
        "max_db_connections": str(SERVER_CONNECTIONS),
        "reserve_pool_size": "0",
        "max_client_conn": "200",
        "server_reset_query": "DISCARD ALL",
        "server_reset_query_always": "1",
        "log_connections": "0",
        "log_disconnections": "0",
    }
    if _version() >= (1, 21):
        settings["max_prepared_statements"] = "0"
    if os.geteuid() == 0:
        # PgBouncer will not run as root: it switches to the account that may reach the
        # server (the embedded one's socket folder belongs to its own account).
        settings["user"] = Path(host).owner() if host.startswith("/") else "nobody"
    config, log_path = folder / "pgbouncer.ini", folder / "pgbouncer.log"
    for _ in range(3):  # another process may take the free port before PgBouncer binds it
        listen_port = free_port()
        config.write_text(
            f"[databases]\n{s['NAME']} = {server}\n\n[pgbouncer]\nlisten_port = {listen_port}\n"
            + "".join(f"{key} = {value}\n" for key, value in settings.items())
        )
        with open(log_path, "w") as log:
            process = subprocess.Popen([PGBOUNCER, str(config)], stdout=log, stderr=log)
        if _listening(process, listen_port):
            break
        assert "Address already in use" in log_path.read_text(), log_path.read_text()
    else:
        raise AssertionError(f"pgbouncer found no free port:\n{log_path.read_text()}")
    try:
        yield f"postgresql://{s['USER']}@127.0.0.1:{listen_port}/{s['NAME']}"
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=10)
    # Nothing went wrong between the processes and PostgreSQL (PgBouncer's own view).
    complaints = re.findall(r"^.* (?:WARNING|ERROR|FATAL) .*$", log_path.read_text(), re.M)
    assert not complaints, complaints


def _listening(process: subprocess.Popen, port: int) -> bool:
    """True once PgBouncer accepts connections; False if it stopped (its log says why)."""
    deadline = time.monotonic() + 20
    while process.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            if time.monotonic() > deadline:
                process.kill()
                raise AssertionError("pgbouncer did not start listening in 20 s") from None
            time.sleep(0.1)
    return False


def _version() -> tuple[int, ...]:
    out = subprocess.run([PGBOUNCER, "--version"], capture_output=True, text=True).stdout
    found = re.search(r"PgBouncer (\d+)\.(\d+)", out)
    return (int(found[1]), int(found[2])) if found else (0, 0)


@pytest.fixture
def pgbouncer(tmp_path) -> Iterator[str]:
    with pgbouncer_serving(tmp_path) as url:
        yield url


LISTENER = "notifyqueue-listen"


def server_connections() -> tuple[int, int]:
    """The test database's client sessions other than this process's (autovacuum is not
    one): (those that came through PgBouncer, the workers' direct LISTEN sessions, named by
    their application_name)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE application_name IS DISTINCT FROM %(name)s), "
            "count(*) FILTER (WHERE application_name = %(name)s "
            "AND query = 'LISTEN notifyqueue_due') "
            "FROM pg_stat_activity WHERE datname = current_database() "
            "AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
            {"name": LISTENER},
        )
        return cursor.fetchone()


@pytest.fixture
def admissions():
    """Keeps a copy of every rate-limit admission (ratelimit_delivery's rows, which the limit
    itself deletes once they leave the window): the database's own times, for an exact check
    of the limit. Removed afterwards."""
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE test_admission (key bytea, at timestamptz, claim_token uuid);"
            "CREATE FUNCTION test_admission_copy() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN INSERT INTO test_admission VALUES (NEW.key, NEW.at, NEW.claim_token); "
            "RETURN NEW; END $$;"
            "CREATE TRIGGER test_admission_copy AFTER INSERT ON ratelimit_delivery "
            "FOR EACH ROW EXECUTE FUNCTION test_admission_copy();"
        )
    yield
    with connection.cursor() as cursor:
        cursor.execute(
            "DROP TRIGGER test_admission_copy ON ratelimit_delivery;"
            "DROP FUNCTION test_admission_copy(); DROP TABLE test_admission;"
        )


def sent_admissions() -> dict[bytes, list]:
    """The database's admission times of the deliveries that ended SENT, per rate-limit key."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT t.key, t.at FROM test_admission AS t "
            "JOIN delivery_attempt AS a ON a.claim_token = t.claim_token "
            "WHERE a.outcome = 'SENT' ORDER BY t.key, t.at"
        )
        rows = cursor.fetchall()
    by_key: dict[bytes, list] = {}
    for key, at in rows:
        by_key.setdefault(bytes(key), []).append(at)
    return by_key


def windows_over_the_limit(by_key: dict[bytes, list]) -> list:
    """Each (key, first, last) where LIMIT + 1 admissions lie within less than WINDOW_S."""
    return [
        (key.hex()[:12], times[i], times[i + LIMIT])
        for key, times in by_key.items()
        for i in range(len(times) - LIMIT)
        if (times[i + LIMIT] - times[i]).total_seconds() < WINDOW_S
    ]


def test_three_workers_through_pgbouncer_deliver_everything_exactly_once(
    pgbouncer, database_url, admissions
):
    separator = "&" if "?" in database_url else "?"
    listen_url = f"{database_url}{separator}application_name={LISTENER}"
    with (
        WebhookReceiver() as webhooks,
        ScriptedProvider() as provider,
        Workers(
            pgbouncer,
            provider.url,
            NOTIFYQUEUE_LISTEN_DATABASE_URL=listen_url,
            NOTIFYQUEUE_RATE_LIMIT=str(LIMIT),
            NOTIFYQUEUE_RATE_LIMIT_WINDOW_SECONDS=str(WINDOW_S),
            NOTIFYQUEUE_POLL_INTERVAL_SECONDS="0.5",
        ) as workers,
    ):
        for _ in range(3):
            workers.start()
        wait_until(
            lambda: server_connections()[1] == 3,
            timeout_s=60,
            what="three workers LISTENing on their direct connection",
        )
        client = ClientFactory(webhook_url=webhooks.url)
        same = [f"{name}@example.com" for name in ("ada", "bob", "cy")] * 8
        busy = [f"busy-{i}@example.com" for i in range(10)]
        rejected = [f"reject-{i}@example.com" for i in range(10)]
        dead = [f"busy-dead-{i}@example.com" for i in range(5)]
        plain = [f"user-{i}@example.com" for i in range(251)]
        notifications_create(client, same + busy + rejected + plain)
        for recipient in dead:
            NotificationFactory(client=client, recipient=recipient, max_attempts=2)
        seen = []

        def finished() -> bool:
            seen.append(server_connections())
            return all_final()

        try:
            wait_until(finished, timeout_s=120, what="every notification final")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{workers.logs()}") from None
        # The limit is checked below on the database's admission times, not the provider's
        # arrival times: PgBouncer's queue for its three server connections may delay a
        # send after its admission by more than universal_check's half-second allowance.
        counts = universal_check(provider, workers, webhooks=webhooks)
        logs = full_logs(workers)

    problems = [line for line in logs.splitlines() if DATABASE_ERROR.search(line)]
    assert not problems, logs
    assert not unexpected_endings(), f"{unexpected_endings()}\n{logs}"
    assert counts == {
        Status.SENT: len(same) + len(busy) + len(plain),
        Status.FAILED: len(rejected),
        Status.DEAD_LETTERED: len(dead),
    }
    assert len(provider.sends) == counts[Status.SENT]
    admitted = sent_admissions()
    # The three recipients with 8 each went out over at least three windows, never more
    # than LIMIT in one: the advisory-locked admission and its deferrals ran.
    assert sorted(len(times) for times in admitted.values() if len(times) > 1) == [8, 8, 8]
    assert not windows_over_the_limit(admitted), windows_over_the_limit(admitted)
    assert [p.returncode for p in workers.processes] == [0, 0, 0], logs
    # However many clients, PgBouncer held at most its pool's server connections; the three
    # LISTEN sessions stayed open beside it the whole time.
    assert max(through for through, _ in seen) <= SERVER_CONNECTIONS, seen
    assert {listening for _, listening in seen} == {3}, seen


def full_logs(workers: Workers) -> str:
    """Every line each worker wrote (Workers.logs() keeps only the end of each)."""
    logs = []
    for process in workers.processes:
        process.log.seek(0)
        logs.append(f"--- pid {process.pid} ---\n{process.log.read()}")
    return "\n".join(logs)


def unexpected_endings() -> list:
    """Each notification that did not end as its recipient says (`reject-`: FAILED,
    `busy-dead-`: DEAD_LETTERED, the rest SENT), with its attempts."""
    expected = {"reject-": Status.FAILED, "busy-dead-": Status.DEAD_LETTERED}
    odd = []
    for notification in Notification.objects.all():
        prefix = next((p for p in expected if notification.recipient.startswith(p)), None)
        if notification.status != expected.get(prefix, Status.SENT):
            attempts = DeliveryAttempt.objects.filter(notification=notification).order_by("number")
            odd.append(
                (
                    notification.recipient,
                    notification.status,
                    [
                        (a.number, a.outcome, a.error, a.worker, a.started_at, a.finished_at)
                        for a in attempts
                    ],
                )
            )
    return odd


class Api:
    def __init__(self, base: str, key: str) -> None:
        self.base, self.key = base, key

    def call(self, method: str, path: str, body=None, **headers: str) -> tuple[int, dict]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.base + path,
            data=data,
            method=method,
            headers={
                "Authorization": f"Api-Key {self.key}",
                "Content-Type": "application/json",
                **headers,
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=20) as response:
                raw = response.read()
                status = response.status
        except urllib.error.HTTPError as refused:
            raw, status = refused.read(), refused.code
        return status, json.loads(raw) if raw[:1] in (b"{", b"[") else {}


def test_the_api_and_admin_through_pgbouncer_never_answer_500(pgbouncer, make_client):
    _, key = make_client("acme")
    operator_client, operator_key = make_client("ops", is_operator=True)
    User.objects.create_superuser("root", "root@example.com", "a-long-admin-password")
    # No worker runs here: /status must not call the fresh PENDING rows overdue (a 503).
    env = gunicorn_environment(
        DATABASE_URL=pgbouncer, NOTIFYQUEUE_STATUS_MAX_OVERDUE_SECONDS="3600"
    )
    with gunicorn_serving(env, workers=2) as base:
        api, operator = Api(base, key), Api(base, operator_key)
        new = {"channel": "email", "recipient": "ada@example.com", "subject": "Hi", "body": "b"}
        answers = {}
        created = []
        for i in range(3):
            status, body = api.call(
                "POST", "/api/v1/notifications", new, **{"Idempotency-Key": f"k{i}"}
            )
            answers[f"create {i}"] = status
            created.append(body.get("id"))
        answers["create again"] = api.call(
            "POST", "/api/v1/notifications", new, **{"Idempotency-Key": "k0"}
        )[0]
        batch = [{**new, "idempotency_key": f"b{i}"} for i in range(5)]
        status, body = api.call("POST", "/api/v1/notifications/batch", {"notifications": batch})
        answers["batch"] = status
        assert [r["status"] for r in body["results"]] == [201] * 5, body
        answers["read"] = api.call("GET", f"/api/v1/notifications/{created[0]}")[0]
        answers["attempts"] = api.call("GET", f"/api/v1/notifications/{created[0]}/attempts")[0]
        status, body = api.call("GET", "/api/v1/notifications?status=PENDING&channel=email")
        answers["list"] = status
        assert len(body["results"]) == 8, body
        answers["cancel"] = api.call("POST", f"/api/v1/notifications/{created[1]}/cancel")[0]
        answers["cancel again"] = api.call("POST", f"/api/v1/notifications/{created[1]}/cancel")[0]
        failed = NotificationFactory(client=operator_client, status=Status.FAILED, attempt_count=6)
        NotificationFactory.create_batch(2, client=operator_client, status=Status.DEAD_LETTERED)
        answers["retry"] = operator.call("POST", f"/api/v1/notifications/{failed.id}/retry")[0]
        status, body = operator.call(
            "POST", "/api/v1/notifications/retry", {"status": "DEAD_LETTERED"}
        )
        answers["bulk retry"] = status
        assert body == {"retried": 2, "remaining": 0}, body
        template = {"subject": "Hello {name}", "body": "Hi {name}"}
        answers["template put"] = api.call("PUT", "/api/v1/templates/welcome/email", template)[0]
        answers["template get"] = api.call("GET", "/api/v1/templates/welcome/email")[0]
        prefs = {"channels": ["email"], "addresses": {"email": "u1@example.com"}}
        answers["prefs put"] = api.call("PUT", "/api/v1/users/u1/preferences", prefs)[0]
        answers["inbox"] = api.call("GET", "/api/v1/users/u1/inbox")[0]
        answers["status"] = api.call("GET", "/status")[0]
        answers["metrics"] = urllib.request.urlopen(f"{base}/metrics", timeout=20).status
        answers.update(admin_pages(base))

    assert answers == {
        **{f"create {i}": 201 for i in range(3)},
        "create again": 200,
        "batch": 200,
        "read": 200,
        "attempts": 200,
        "list": 200,
        "cancel": 200,
        "cancel again": 409,
        "retry": 200,
        "bulk retry": 200,
        "template put": 201,
        "template get": 200,
        "prefs put": 201,
        "inbox": 200,
        "status": 200,
        "metrics": 200,
        **{page: 200 for page in ADMIN_PAGES},
    }


ADMIN_PAGES = (
    "/admin/",
    "/admin/notifications/notification/",
    "/admin/message_templates/messagetemplate/add/",
    "/admin/clients/clientapikey/add/",
)


def admin_pages(base: str) -> dict[str, int]:
    """Logs in to the admin (session and CSRF in the database, through PgBouncer) and opens
    its pages, including add forms whose client select lists query as they render."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    opener.open(f"{base}/admin/login/", timeout=20).read()
    token = next(c.value for c in jar if c.name == "csrftoken")
    form = urllib.parse.urlencode(
        {
            "username": "root",
            "password": "a-long-admin-password",
            "csrfmiddlewaretoken": token,
            "next": "/admin/",
        }
    ).encode()
    opener.open(
        urllib.request.Request(f"{base}/admin/login/", data=form, headers={"Referer": base}),
        timeout=20,
    ).read()
    statuses = {}
    for page in ADMIN_PAGES:
        try:
            with opener.open(f"{base}{page}", timeout=20) as response:
                statuses[page] = response.status
                assert "login" not in response.url, "not logged in"
        except urllib.error.HTTPError as refused:
            statuses[page] = refused.code
    return statuses
