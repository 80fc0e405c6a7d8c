"""The webhook sender against a real HTTP receiver on 127.0.0.1 and real PostgreSQL."""

import json
import re
import time
from datetime import timedelta

import psycopg
import pytest
from django.db import OperationalError, connection, transaction
from django.utils import timezone
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from clients.models import Client
from notifications.models import Notification, Status
from notifyqueue.outbound import OutboundTarget, outbound_post_to
from tests.support.clock import DbClock
from tests.support.factories import ClientFactory, NotificationFactory
from tests.support.operator_helpers import notifications_insert_bulk
from tests.support.queue_table import webhook_queue_differences
from tests.support.reads import pages_visited_by_relation, table_reads, table_reads_since
from tests.support.webhook_factories import WebhookEventFactory
from tests.support.webhook_receiver import Reply, WebhookReceiver
from webhooks import repositories
from webhooks.models import AttemptOutcome, DeliveryState, WebhookEvent
from webhooks.repositories import QUERIES, EventResult
from webhooks.services import (
    client_webhook_secret_rotate,
    webhook_events_deliver_due,
    webhook_events_reclaim_expired,
    webhook_events_redeliver,
)

pytestmark = pytest.mark.django_db

# Longer than any retry wait in these tests (the schedule is set to 1 s steps below).
PAST_BACKOFF_S = 2


@pytest.fixture(autouse=True)
def webhook_settings(settings):
    settings.NOTIFYQUEUE_WEBHOOK_ALLOW_PRIVATE = True
    settings.NOTIFYQUEUE_WEBHOOK_TIMEOUT_SECONDS = 2.0
    settings.NOTIFYQUEUE_WEBHOOK_RETRY_SCHEDULE = [0, 1]
    settings.NOTIFYQUEUE_WEBHOOK_MAX_ATTEMPTS = 10
    return settings


@pytest.fixture
def receiver():
    with WebhookReceiver() as r:
        yield r


@pytest.fixture
def hooked(receiver) -> Client:
    return ClientFactory(webhook_url=receiver.url)


def event_for(client: Client, **kwargs) -> WebhookEvent:
    notification = NotificationFactory(
        client=client, status=kwargs.pop("status", Status.SENT), attempt_count=2
    )
    return WebhookEventFactory(notification=notification, **kwargs)


def attempts(event: WebhookEvent) -> list[tuple]:
    return list(event.attempts.order_by("number").values_list("number", "outcome", "status_code"))


def test_each_final_status_is_posted_once_correctly_signed(receiver, hooked):
    statuses = [Status.SENT, Status.FAILED, Status.DEAD_LETTERED, Status.SUPPRESSED]
    events = {str(event_for(hooked, status=s).id): s for s in statuses}

    batch = webhook_events_deliver_due()

    assert (batch.claimed, batch.delivered) == (4, 4)
    assert sorted(receiver.event_ids()) == sorted(events)
    for request in receiver.requests:
        payload = Webhook(hooked.webhook_secret).verify(request.body, request.headers)
        event = WebhookEvent.objects.get(id=request.headers["webhook-id"])
        assert payload == {
            "eventId": str(event.id),
            "jobId": str(event.notification_id),
            "status": events[str(event.id)],
            "attemptCount": 2,
            "timestamp": event.occurred_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "type": "status",
        }
        assert request.path == "/hooks"
        assert request.headers["content-type"] == "application/json"
        assert request.headers["user-agent"].startswith("NotifyQueue-Webhooks/")
        assert event.state == DeliveryState.DELIVERED
        assert event.delivered_at is not None and event.last_status_code == 200
        assert event.claim_token is None
        assert attempts(event) == [(1, AttemptOutcome.DELIVERED, 200)]
    # Delivered events are never posted again.
    DbClock().advance(24 * 3600)
    assert webhook_events_deliver_due().claimed == 0
    assert len(receiver.requests) == 4


def test_receiver_failing_three_times_gets_the_event_on_the_fourth_attempt(receiver, hooked):
    receiver.script(Reply(500), Reply(500), Reply(500), Reply(200))
    event = event_for(hooked)
    db_clock = DbClock()
    for expected_attempts in (1, 2, 3):
        assert webhook_events_deliver_due().retrying == 1
        event.refresh_from_db()
        assert event.state == DeliveryState.PENDING
        assert event.delivery_attempts == expected_attempts
        assert event.last_status_code == 500 and "HTTP 500" in event.last_error
        # The schedule's wait, on the database clock: not due again straight away.
        assert event.next_attempt_at > db_clock.now
        assert webhook_events_deliver_due().claimed == 0
        db_clock.advance(PAST_BACKOFF_S)
    assert webhook_events_deliver_due().delivered == 1

    event.refresh_from_db()
    assert event.state == DeliveryState.DELIVERED and event.delivery_attempts == 4
    assert attempts(event) == [
        (1, AttemptOutcome.TEMPORARY_FAILURE, 500),
        (2, AttemptOutcome.TEMPORARY_FAILURE, 500),
        (3, AttemptOutcome.TEMPORARY_FAILURE, 500),
        (4, AttemptOutcome.DELIVERED, 200),
    ]
    assert receiver.event_ids() == [str(event.id)] * 4
    assert all(a.finished_at >= a.started_at for a in event.attempts.all())


def test_receiver_that_never_answers_2xx_ends_failed_and_the_notification_is_untouched(
    receiver, hooked, webhook_settings
):
    webhook_settings.NOTIFYQUEUE_WEBHOOK_MAX_ATTEMPTS = 3
    receiver.default = Reply(503)
    event = event_for(hooked)
    columns = [f.attname for f in Notification._meta.concrete_fields]
    before = Notification.objects.filter(id=event.notification_id).values(*columns).get()

    db_clock = DbClock()
    for _ in range(6):
        webhook_events_deliver_due()
        db_clock.advance(PAST_BACKOFF_S)

    event.refresh_from_db()
    assert event.state == DeliveryState.FAILED
    assert event.delivery_attempts == 3 and len(receiver.requests) == 3
    assert "HTTP 503" in event.last_error
    assert [a[1] for a in attempts(event)] == [AttemptOutcome.TEMPORARY_FAILURE] * 3
    after = Notification.objects.filter(id=event.notification_id).values(*columns).get()
    assert after == before
    assert after["status"] == Status.SENT


def test_slow_receiver_is_cut_off_at_the_timeout_and_retried(receiver, hooked, webhook_settings):
    webhook_settings.NOTIFYQUEUE_WEBHOOK_TIMEOUT_SECONDS = 0.3
    receiver.script(Reply(200, delay_s=5))
    event = event_for(hooked)

    started = time.monotonic()
    batch = webhook_events_deliver_due()
    elapsed = time.monotonic() - started

    assert elapsed < 0.3 + 0.7
    assert batch.retrying == 1
    event.refresh_from_db()
    assert event.state == DeliveryState.PENDING
    attempt = event.attempts.get()
    assert attempt.outcome == AttemptOutcome.TEMPORARY_FAILURE
    assert "timed out" in attempt.error and attempt.status_code is None
    assert attempt.duration_ms < 1000


def test_receiver_dripping_its_headers_is_cut_off_at_the_total_deadline(
    receiver, hooked, webhook_settings
):
    # Each header line arrives well within the per-read timeout; only a total deadline ends it.
    webhook_settings.NOTIFYQUEUE_WEBHOOK_TIMEOUT_SECONDS = 0.5
    receiver.script(Reply(200, drip_header_s=4))
    event = event_for(hooked)

    started = time.monotonic()
    batch = webhook_events_deliver_due()
    elapsed = time.monotonic() - started

    assert elapsed < 0.5 + 0.7
    assert batch.retrying == 1
    assert "timed out" in event.attempts.get().error


def test_slow_receiver_does_not_hold_up_the_other_events_in_its_batch(
    receiver, hooked, webhook_settings
):
    webhook_settings.NOTIFYQUEUE_WEBHOOK_TIMEOUT_SECONDS = 1.0
    webhook_settings.NOTIFYQUEUE_WEBHOOK_CONCURRENCY = 4
    receiver.script(Reply(200, delay_s=0.8), Reply(200), Reply(200), Reply(200))
    for _ in range(4):
        event_for(hooked)

    started = time.monotonic()
    batch = webhook_events_deliver_due()

    assert batch.delivered == 4
    # In series this would take 0.8 s plus three more; overlapping, the slow one dominates.
    assert time.monotonic() - started < 0.8 + 0.5
    fast = sorted(r.at for r in receiver.requests)[1:]
    assert fast[-1] - started < 0.5


def test_loopback_target_is_refused_at_once_when_private_addresses_are_not_allowed(
    receiver, hooked, webhook_settings
):
    webhook_settings.NOTIFYQUEUE_WEBHOOK_ALLOW_PRIVATE = False
    event = event_for(hooked)

    assert webhook_events_deliver_due().failed == 1

    event.refresh_from_db()
    assert event.state == DeliveryState.FAILED and event.delivery_attempts == 1
    assert "127.0.0.1 is a loopback address" in event.last_error
    assert attempts(event) == [(1, AttemptOutcome.PERMANENT_FAILURE, None)]
    assert receiver.requests == []


def test_name_resolving_to_loopback_is_refused(receiver, webhook_settings):
    webhook_settings.NOTIFYQUEUE_WEBHOOK_ALLOW_PRIVATE = False
    client = ClientFactory(webhook_url=f"http://localhost:{receiver.port}/hooks")
    event = event_for(client)

    assert webhook_events_deliver_due().failed == 1
    event.refresh_from_db()
    assert "host localhost refused" in event.last_error
    assert receiver.requests == []


def test_connection_goes_to_the_checked_address_not_to_a_fresh_lookup(receiver):
    # `.invalid` never resolves, so reaching the receiver proves no second DNS lookup happened,
    # while the Host header still names the URL's host.
    url = f"http://hooks.invalid:{receiver.port}/pinned"
    target = OutboundTarget(
        scheme="http", host="hooks.invalid", port=receiver.port, address="127.0.0.1"
    )

    answer = outbound_post_to(url=url, target=target, body=b"{}", headers={}, timeout_s=2)

    assert answer.status_code == 200 and answer.failure is None
    (request,) = receiver.requests
    assert request.path == "/pinned"
    assert request.headers["host"] == f"hooks.invalid:{receiver.port}"


def test_redirects_are_not_followed(receiver, hooked):
    receiver.script(Reply(302, headers={"Location": "http://169.254.169.254/latest/meta-data"}))
    event = event_for(hooked)

    assert webhook_events_deliver_due().retrying == 1
    assert len(receiver.requests) == 1
    event.refresh_from_db()
    assert event.last_status_code == 302 and event.state == DeliveryState.PENDING


def test_client_without_a_webhook_url_fails_the_event_permanently(receiver):
    event = event_for(ClientFactory(webhook_url=""))

    assert webhook_events_deliver_due().failed == 1
    event.refresh_from_db()
    assert event.state == DeliveryState.FAILED and "no webhook URL" in event.last_error


def claim(limit: int = 10):
    return repositories.webhook_events_claim_due(limit=limit, per_client=10, claim_timeout_s=30)


def finish_delivered(event) -> bool:
    """Records a 200 for a claimed event, as its sender would."""
    delivered = EventResult(
        event_id=event.id,
        claim_token=event.claim_token,
        state=DeliveryState.DELIVERED,
        outcome=AttemptOutcome.DELIVERED,
        retry_in_s=None,
        status_code=200,
        error=None,
        duration_ms=5,
    )
    return event.id in repositories.webhook_events_finish([delivered])


def test_result_of_a_sender_whose_claim_was_taken_over_is_dropped(hooked):
    event = event_for(hooked)
    db_clock = DbClock()
    (stale,) = claim()

    db_clock.advance(31)
    (reclaimed,) = webhook_events_reclaim_expired()
    assert (reclaimed.id, reclaimed.state) == (event.id, DeliveryState.PENDING)
    (fresh,) = claim()
    assert fresh.claim_token != stale.claim_token and fresh.attempt_number == 2

    late = finish_delivered(stale)

    assert late is False
    event.refresh_from_db()
    assert event.state == DeliveryState.DELIVERING and event.claim_token == fresh.claim_token
    assert attempts(event) == [(1, AttemptOutcome.ABANDONED, None), (2, None, None)]


def test_one_late_result_in_a_step_is_dropped_and_the_others_are_recorded(hooked):
    """A sender records a step's results in one statement (webhook_events_finish): the one
    whose claim was taken over changes neither its event nor either attempt row, and the
    others are recorded with their own attempt rows."""
    late_event, on_time_event = event_for(hooked), event_for(hooked)
    db_clock = DbClock()
    claimed = {e.id: e for e in claim()}
    db_clock.advance(31)
    assert len(webhook_events_reclaim_expired()) == 2
    claimed_again = {e.id: e for e in claim()}
    stale, on_time = claimed[late_event.id], claimed_again[on_time_event.id]

    recorded = repositories.webhook_events_finish(
        [
            EventResult(
                e.id,
                e.claim_token,
                DeliveryState.DELIVERED,
                AttemptOutcome.DELIVERED,
                None,
                200,
                None,
                5,
            )
            for e in (stale, on_time)
        ]
    )

    assert recorded == {on_time_event.id}
    late_event.refresh_from_db()
    assert late_event.state == DeliveryState.DELIVERING
    assert late_event.claim_token == claimed_again[late_event.id].claim_token
    assert attempts(late_event) == [(1, AttemptOutcome.ABANDONED, None), (2, None, None)]
    assert attempts(on_time_event) == [
        (1, AttemptOutcome.ABANDONED, None),
        (2, AttemptOutcome.DELIVERED, 200),
    ]


def test_expired_claim_on_the_last_attempt_fails_the_event(hooked, webhook_settings):
    webhook_settings.NOTIFYQUEUE_WEBHOOK_MAX_ATTEMPTS = 1
    event = event_for(hooked)
    db_clock = DbClock()
    claim()

    db_clock.advance(29)
    assert webhook_events_reclaim_expired() == []
    db_clock.advance(1)
    (reclaimed,) = webhook_events_reclaim_expired()

    assert reclaimed.state == DeliveryState.FAILED
    event.refresh_from_db()
    assert event.state == DeliveryState.FAILED and "claim expired" in event.last_error


def test_rotated_secret_signs_alongside_the_old_one_for_24_hours(receiver, hooked):
    db_clock = DbClock()
    old = hooked.webhook_secret
    assert client_webhook_secret_rotate(client_id=hooked.id)
    hooked.refresh_from_db()
    new = hooked.webhook_secret
    assert new != old and new.startswith("whsec_")
    assert hooked.previous_webhook_secret == old
    assert hooked.previous_webhook_secret_expires_at == db_clock.now + timedelta(hours=24)

    event_for(hooked)
    db_clock.advance(23 * 3600)
    webhook_events_deliver_due()
    during = receiver.requests[-1]
    Webhook(old).verify(during.body, during.headers)
    Webhook(new).verify(during.body, during.headers)

    event_for(hooked)
    db_clock.advance(2 * 3600)
    webhook_events_deliver_due()
    after = receiver.requests[-1]
    Webhook(new).verify(after.body, after.headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(old).verify(after.body, after.headers)


def test_redelivery_requeues_finished_events_with_the_same_event_id(
    receiver, hooked, webhook_settings
):
    webhook_settings.NOTIFYQUEUE_WEBHOOK_MAX_ATTEMPTS = 1
    receiver.script(Reply(400))
    failed = event_for(hooked)
    webhook_events_deliver_due()
    delivered = event_for(hooked)
    webhook_events_deliver_due()
    pending = event_for(hooked, next_attempt_at=timezone.now() + timedelta(days=1))

    queued = webhook_events_redeliver(event_ids=[failed.id, delivered.id, pending.id])

    assert set(queued) == {failed.id, delivered.id}
    failed.refresh_from_db()
    assert failed.state == DeliveryState.PENDING
    assert (failed.delivery_attempts, failed.redeliveries) == (0, 1)
    assert webhook_events_deliver_due().delivered == 2
    assert sorted(receiver.event_ids()[2:]) == sorted([str(failed.id), str(delivered.id)])
    # Attempt numbers keep counting across the redelivery.
    assert attempts(failed) == [
        (1, AttemptOutcome.TEMPORARY_FAILURE, 400),
        (2, AttemptOutcome.DELIVERED, 200),
    ]
    pending.refresh_from_db()
    assert (pending.state, pending.redeliveries) == (DeliveryState.PENDING, 0)


def step_claim(cursor) -> str:
    """The claim of webhook_events_step as PostgreSQL runs it (the function's second RETURN
    QUERY), its parameters turned into the query parameters of the same names, under the
    function's own settings (set for the transaction): for EXPLAIN."""
    cursor.execute("SELECT prosrc, proconfig FROM pg_proc WHERE proname = 'webhook_events_step'")
    source, settings = cursor.fetchone()
    statement = source.split("RETURN QUERY", 2)[2].split(";", 1)[0]
    for setting in settings:
        name, value = setting.split("=", 1)
        cursor.execute("SELECT set_config(%s, %s, true)", [name, value])
    statement = re.sub(r"\bp_worker\b", "%(worker)s::text", statement)
    return re.sub(r"\bp_(limit|per_client|claim_timeout_s)\b", r"%(\1)s", statement)


@pytest.mark.parametrize(
    "query, index",
    [
        ("webhook_event_claim_due", "webhook_queue_client_due"),
        ("webhook_event_claim_due", "webhook_queue_client_busy"),
        ("webhook_event_reclaim_expired", "webhook_queue_claim_expiry"),
        ("webhook_event_reclaim_expired", "webhook_queue_claimed_by"),
    ],
)
def test_maintenance_queries_read_their_partial_index(query, index):
    params = {
        "limit": 10,
        "per_client": 4,
        "claim_timeout_s": 30,
        "max_attempts": 10,
        "worker": "w-1",
        "dead_after_s": 30,
    }
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        statement = step_claim(cursor) if query == "webhook_event_claim_due" else QUERIES[query]
        cursor.execute("EXPLAIN " + statement, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert index in plan, plan


def test_webhook_payload_is_the_exact_bytes_that_were_signed(receiver, hooked):
    event_for(hooked)
    webhook_events_deliver_due()
    (request,) = receiver.requests
    assert set(json.loads(request.body)) == {
        "eventId",
        "jobId",
        "status",
        "attemptCount",
        "timestamp",
        "type",
    }
    tampered = dict(request.headers, **{"webhook-id": "another-id"})
    with pytest.raises(WebhookVerificationError):
        Webhook(hooked.webhook_secret).verify(request.body, tampered)


def _backlog(client: Client, count: int, state: str = "PENDING") -> None:
    """`count` due events for `client`, written in one statement (one notification suffices)."""
    notification = NotificationFactory(client=client, status=Status.SENT, attempt_count=1)
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO webhook_event (id, client_id, notification_id, status, attempt_count,
                                       occurred_at, state, delivery_attempts, next_attempt_at,
                                       created_at)
            SELECT gen_random_uuid(), %s, %s, 'SENT', 1, now(), %s, 0,
                   now() - make_interval(secs => g), now()
            FROM generate_series(1, %s) AS g
            """,
            [client.id, notification.id, state, count],
        )
        cursor.execute("ANALYZE webhook_event")
        cursor.execute("ANALYZE webhook_queue")


def _claim_choice_buffers() -> int:
    """Shared buffers the fair claim reads to choose its events (the `clients` and `due`
    steps), measured with EXPLAIN ANALYZE and rolled back. Marking the chosen rows costs the
    same per row whatever the backlog, and is left out."""

    class Rollback(Exception):
        pass

    params = {"limit": 16, "per_client": 4, "claim_timeout_s": 30, "worker": "w-1"}
    with connection.cursor() as cursor:
        # Rows earlier tests inserted and rolled back leave dead index entries that the first
        # scan marks dead as it passes (as a live queue's delivered rows do until vacuum);
        # measure the steady state after that pass.
        cursor.execute("SELECT count(*) FROM webhook_queue WHERE state = 'PENDING'")
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            # The function's settings (small tables are not read whole with them either, so
            # the plan is the one a large table gets at both sizes).
            cursor.execute(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + step_claim(cursor),
                params,
            )
            (plan,) = cursor.fetchone()[0]
            raise Rollback(plan)
    except Rollback as done:
        plan = done.args[0]["Plan"]
    steps = [p for p in plan["Plans"] if p.get("Subplan Name") in ("CTE clients", "CTE due")]
    assert len(steps) == 2, plan
    return sum(p["Shared Hit Blocks"] + p["Shared Read Blocks"] for p in steps)


def test_the_fair_claims_cost_does_not_grow_with_the_backlog_or_history():
    clients = [ClientFactory(webhook_url=f"https://hooks{i}.example.com/") for i in range(5)]
    for client in clients:
        _backlog(client, 200)
    _backlog(clients[0], 4_000)
    small = _claim_choice_buffers()
    # One client's endpoint is dead and another's slow: their events pile up, eight times
    # over; delivered history accumulates too.
    _backlog(clients[0], 20_000)
    _backlog(clients[3], 20_000)
    _backlog(clients[1], 20_000, state="DELIVERED")
    large = _claim_choice_buffers()

    print(f"fair claim reads {small} buffers with 5,000 waiting events, {large} with 45,000")
    # Nine times the backlog: the indexes grow a level deeper, a page more for each of the
    # claim's ~30 index probes. Reading the backlog itself would cost hundreds of pages more.
    assert large <= small + 50


def test_one_statement_changing_many_rows_queues_an_event_for_each_row_that_became_final():
    # The outbox trigger runs once per statement: within one UPDATE
    # it must still pick exactly the rows whose status changed to a reported final status, of
    # clients with a webhook URL.
    hooked = ClientFactory(webhook_url="https://hooks.example.com/notify")
    silent = ClientFactory(webhook_url="")
    becomes_sent = NotificationFactory(client=hooked, status=Status.PENDING)
    becomes_dead = NotificationFactory(client=hooked, status=Status.PENDING)
    stays_sent = NotificationFactory(client=hooked, status=Status.SENT)
    becomes_cancelled = NotificationFactory(client=hooked, status=Status.PENDING)
    unhooked_sent = NotificationFactory(client=silent, status=Status.PENDING)
    new_status = {
        becomes_sent.id: Status.SENT,
        becomes_dead.id: Status.DEAD_LETTERED,
        stays_sent.id: Status.SENT,  # final already: its status does not change
        becomes_cancelled.id: Status.CANCELLED,  # final, but not reported
        unhooked_sent.id: Status.SENT,  # its client has no webhook URL
    }
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE notification AS n SET status = s.status, updated_at = now() "
            "FROM unnest(%s::uuid[], %s::text[]) AS s(id, status) WHERE n.id = s.id",
            [list(new_status), [str(status) for status in new_status.values()]],
        )

    queued = sorted(
        WebhookEvent.objects.values_list("notification_id", "status", "client_id"),
        key=str,
    )
    assert queued == sorted(
        [
            (becomes_sent.id, Status.SENT, hooked.id),
            (becomes_dead.id, Status.DEAD_LETTERED, hooked.id),
        ],
        key=str,
    )


@pytest.mark.django_db(transaction=True)
def test_one_statement_finishing_more_rows_than_work_mem_holds_queues_them_in_linear_time(
    database_url,
):
    """The outbox trigger finds the rows whose status changed with a hashed NOT IN over the
    statement's old rows. PostgreSQL hashes it only when the old rows it expects fit in
    `work_mem`; its plan is made at the trigger's first run in a session, from that
    statement's row count, and kept. A session whose first such statement changed more rows
    than that (about 150,000 at the default 4 MB) compared every new row with every old one:
    200,000 rows marked SENT in one UPDATE ran for over ten minutes. The trigger now plans with
    `work_mem` of its own (a `SET` clause of the function); here the session's is at PostgreSQL's
    minimum, so 30,000 rows are well past it: before the change the UPDATE was still running at
    the 60 s timeout; after it, the whole test took 2.6 s."""
    hooked = ClientFactory(webhook_url="https://hooks.example.com/notify")
    notifications_insert_bulk(client_id=hooked.id, count=30_000, status="PENDING")
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("SET work_mem = '64kB'")
        conn.execute("SET statement_timeout = '60s'")  # quadratic takes minutes; linear, a second
        conn.execute("UPDATE notification SET status = 'SENT', sent_at = now()")
    assert WebhookEvent.objects.filter(client=hooked, status=Status.SENT).count() == 30_000
    assert not Notification.objects.exclude(status=Status.SENT).exists()


def test_every_kind_of_write_keeps_the_webhook_queue_equal_to_the_events_not_final(
    receiver, hooked, webhook_settings
):
    """webhook_queue is written only by the triggers on webhook_event (`webhook_queue_*`): after
    the outbox's insert, a claim, each kind of finish, the reaper, a redelivery, an operator's
    update and retention's delete it holds exactly the PENDING and DELIVERING events."""
    webhook_settings.NOTIFYQUEUE_WEBHOOK_MAX_ATTEMPTS = 2
    notification = NotificationFactory(client=hooked, status=Status.PENDING)
    Notification.objects.filter(id=notification.id).update(status=Status.SENT)  # the outbox
    events = [event_for(hooked) for _ in range(4)]
    assert WebhookEvent.objects.filter(notification=notification).count() == 1
    assert webhook_queue_differences() == []
    clock = DbClock()

    claimed = claim()
    assert len(claimed) == 5
    assert webhook_queue_differences() == []
    delivered, retried, failed, *_stalled = claimed
    ended = [
        EventResult(
            event_id=event.id,
            claim_token=event.claim_token,
            state=state,
            outcome=AttemptOutcome.TEMPORARY_FAILURE,
            retry_in_s=retry_in_s,
            status_code=500,
            error="boom",
            duration_ms=1,
        )
        for event, state, retry_in_s in [
            (delivered, DeliveryState.DELIVERED, None),
            (retried, DeliveryState.PENDING, 60),
            (failed, DeliveryState.FAILED, None),
        ]
    ]
    assert repositories.webhook_events_finish(ended) == {delivered.id, retried.id, failed.id}
    assert webhook_queue_differences() == []
    clock.advance(31)  # past the claim: the reaper takes back the last two
    assert len(webhook_events_reclaim_expired()) == 2
    assert webhook_queue_differences() == []
    assert set(webhook_events_redeliver(event_ids=[delivered.id, failed.id])) == {
        delivered.id,
        failed.id,
    }
    WebhookEvent.objects.filter(id=retried.id).update(next_attempt_at=timezone.now())
    assert webhook_queue_differences() == []
    # Two batches: a client has at most NOTIFYQUEUE_WEBHOOK_CLIENT_CONCURRENCY (4) in flight.
    assert [webhook_events_deliver_due().delivered for _ in range(2)] == [4, 1]
    assert webhook_queue_differences() == []
    WebhookEvent.objects.filter(id__in=[e.id for e in events]).delete()
    assert webhook_queue_differences() == []
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM webhook_queue")
        assert (
            cursor.fetchone()[0]
            == WebhookEvent.objects.filter(
                state__in=[DeliveryState.PENDING, DeliveryState.DELIVERING]
            ).count()
        )


def test_a_truncate_of_the_events_empties_the_webhook_queue(receiver, hooked):
    """TRUNCATE fires no DELETE trigger; without its own, the queue kept the truncated events,
    and those DELIVERING went on filling their client's share of the senders, so its next
    events were never claimed (`webhook_queue_truncated`)."""
    for _ in range(4):
        event_for(hooked)
    assert len(claim()) == 4  # the client's whole share, in flight
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # TRUNCATE refuses pending checks
        cursor.execute("TRUNCATE webhook_event CASCADE")
    assert webhook_queue_differences() == []
    event_for(hooked)
    assert webhook_events_deliver_due().delivered == 1


def _claim_pages_visited() -> dict[str, int]:
    """Pages of each table and index the claim of one due event visits (as its transaction's
    counters say), for an event made due for it."""
    with transaction.atomic():  # the counters are the transaction's
        before = pages_visited_by_relation()
        [_] = claim(limit=1)
        after = pages_visited_by_relation()
    return {name: pages - before[name] for name, pages in after.items() if pages > before[name]}


@pytest.mark.django_db(transaction=True)
def test_the_claim_steps_over_no_delivered_event_once_the_queue_not_the_history_is_vacuumed(
    database_url, receiver
):
    """Every delivered event was PENDING and DELIVERING on its way, and each step left an entry
    in the claim's partial indexes until VACUUM. On webhook_event, which keeps the history,
    those indexes held them until a VACUUM of the whole history (autovacuum waits for a fifth
    of the table to be dead): a claim of one event after 20,000 deliveries visited 1,362
    pages, 57 once vacuumed, and more as the history grew. On webhook_queue (migration
    0006) they are dead rows of a table of the events not yet final: a VACUUM of the queue
    alone, whose cost is the backlog's, leaves the claim as cheap as on a fresh database."""
    client = ClientFactory(webhook_url=receiver.url)
    event_for(client)
    fresh = _claim_pages_visited()

    _backlog(client, 20_000)
    with connection.cursor() as cursor:  # claimed, then delivered, as a sender does
        cursor.execute(
            "UPDATE webhook_event SET state = 'DELIVERING', claim_token = gen_random_uuid(), "
            "claim_expires_at = now() + interval '30 seconds' WHERE state = 'PENDING'"
        )
        cursor.execute(
            "UPDATE webhook_event SET state = 'DELIVERED', claim_token = NULL, "
            "claim_expires_at = NULL, delivered_at = now() WHERE state = 'DELIVERING'"
        )
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("VACUUM webhook_queue")
        conn.execute("ANALYZE webhook_event")
        queue_pages = conn.execute(
            "SELECT pg_relation_size('webhook_queue') / current_setting('block_size')::int"
        ).fetchone()[0]
    event_for(client)
    after_history = _claim_pages_visited()

    fresh_queue, queue = (
        sum(pages for name, pages in visited.items() if name.startswith("webhook_queue"))
        for visited in (fresh, after_history)
    )
    print(
        f"claim of one event visits {sum(fresh.values())} pages fresh ({fresh_queue} of the "
        f"queue), {sum(after_history.values())} after 20,000 deliveries ({queue} of the queue, "
        f"{queue_pages} pages in it)"
    )
    # The rest is the event's own look-ups and new index entries, a level deeper in the
    # history's indexes: a page or a few each, not a walk.
    assert queue <= fresh_queue + 5, (fresh, after_history)
    assert sum(after_history.values()) < 100, after_history


@pytest.mark.django_db(transaction=True)
def test_a_finish_reads_its_event_by_key_however_many_are_in_flight(database_url, receiver):
    """The in-flight events' partial indexes are nearly empty whenever their statistics are
    taken, so a finish that also named the state read one of them instead of the primary
    key: every event in flight, for each event finished (1, 4, 16, 64 entries with 1, 2, 4,
    8 in flight)."""
    client = ClientFactory(webhook_url=receiver.url)
    notifications_insert_bulk(client_id=client.id, count=5_000, status="PENDING")
    Notification.objects.filter(client=client).update(status=Status.SENT)  # 5,000 events
    with connection.cursor() as cursor:
        cursor.execute("UPDATE webhook_event SET state = 'DELIVERED', delivered_at = now()")
    for _ in range(8):
        event_for(client)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE webhook_event")
    DbClock().advance(1)
    in_flight = claim()
    assert len(in_flight) == 8
    with transaction.atomic():  # the counters are the transaction's
        before = table_reads("webhook_event")
        for event in in_flight:
            assert finish_delivered(event)
        reads = table_reads_since("webhook_event", before)
    assert set(reads) == {"webhook_event_pkey"}  # no in-flight index, nor the table
    scans, entries = reads["webhook_event_pkey"]
    # Each event's key has two entries: its version before the claim's update (not HOT: the
    # state is in the partial indexes' conditions) and the current one.
    assert scans == 8 and entries <= 16


@pytest.mark.django_db(transaction=True)
def test_a_step_whose_results_cannot_be_written_keeps_them_for_the_next_step(
    receiver, hooked, database_url
):
    """The POST succeeded but the step's finish fails (here another session holds the event's
    row past the sender's lock timeout; a dropped connection ends the same way). The result
    stays with the sender, its slot still taken, and the next step records it: the event is
    DELIVERED after one POST. Dropped with the failed step, the claim would have stayed
    DELIVERING until it expired and the receiver would have had the event a second time."""
    from webhooks.services import WebhookDeliveries

    event = event_for(hooked)
    deliveries = WebhookDeliveries(concurrency=4)
    try:
        assert deliveries.step().claimed == 1
        receiver.wait_for(1)
        with psycopg.connect(database_url, autocommit=False) as holder:
            holder.execute("SELECT 1 FROM webhook_event WHERE id = %s FOR UPDATE", [event.id])
            with connection.cursor() as cursor:
                cursor.execute("SET lock_timeout = '200ms'")
            try:
                with pytest.raises(OperationalError) as failed:
                    deliveries.step(wait_s=5)
                assert isinstance(failed.value.__cause__, psycopg.errors.LockNotAvailable)
            finally:
                with connection.cursor() as cursor:
                    cursor.execute("RESET lock_timeout")
        assert deliveries.in_flight == 1
        batch = deliveries.step(wait_s=5)
        assert (batch.delivered, batch.stale) == (1, 0)
    finally:
        deliveries.close()
    event.refresh_from_db()
    assert event.state == DeliveryState.DELIVERED
    assert attempts(event) == [(1, AttemptOutcome.DELIVERED, 200)]
    assert len(receiver.requests) == 1
