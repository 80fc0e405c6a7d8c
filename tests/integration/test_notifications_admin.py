"""The admin as the operator's console: the list, its filters and search, the detail page
with attempts and webhook events, and the retry and cancel actions with their permissions."""

from __future__ import annotations

import html
import re
from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.contrib.messages import get_messages
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from delivery.models import DeliveryAttempt, Outcome
from monitoring import paginators
from notifications.models import Channel, Notification, Priority, Status
from tests.support.factories import ClientFactory, NotificationFactory
from tests.support.operator_helpers import notifications_insert_bulk
from tests.support.reads import history_read_whole
from tests.support.webhook_factories import WebhookEventFactory
from webhooks.models import DeliveryState

pytestmark = pytest.mark.django_db

LIST = "/admin/notifications/notification/"


def detail(notification) -> str:
    return f"{LIST}{notification.id}/change/"


def staff_with(client, *codenames: str):
    user = User.objects.create_user("staff", password="pw", is_staff=True)
    for codename in codenames:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client.force_login(user)
    return client


def messages_of(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def listed(response) -> set:
    return {row.pk for row in response.context["cl"].result_list}


def test_list_shows_notifications_with_priority_names_and_attempts(superuser):
    NotificationFactory(priority=Priority.CRITICAL, attempt_count=2, recipient="ada@example.com")

    response = superuser.get(LIST)

    assert response.status_code == 200
    page = response.content.decode()
    assert "ada@example.com" in page
    assert "Critical" in page
    assert "2/6" in page


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("status__exact=DEAD_LETTERED", {"dead"}),
        ("channel__exact=sms", {"sms"}),
        ("priority__exact=0", {"critical"}),
    ],
)
def test_each_filter_narrows_the_list(superuser, query, expected):
    rows = {
        "dead": NotificationFactory(status=Status.DEAD_LETTERED, attempt_count=6),
        "sms": NotificationFactory(channel=Channel.SMS, recipient="+447700900123"),
        "critical": NotificationFactory(priority=Priority.CRITICAL),
    }

    response = superuser.get(f"{LIST}?{query}")

    assert response.status_code == 200
    assert listed(response) == {rows[name].pk for name in expected}


def test_client_and_created_date_filters(superuser):
    globex = ClientFactory(name="globex")
    theirs = NotificationFactory(client=globex)
    old = NotificationFactory(created_at=timezone.now() - timedelta(days=40))

    by_client = superuser.get(f"{LIST}?client__id__exact={globex.id}")
    # The date filter's own "Past 7 days" link, as an operator would click it.
    page = superuser.get(LIST).content.decode()
    past_week = html.unescape(
        re.search(r'href="(\?created_at__gte=[^"]+)"[^>]*>Past 7 days', page)[1]
    )
    by_date = superuser.get(LIST + past_week)

    assert listed(by_client) == {theirs.pk}
    assert old.pk not in listed(by_date)
    assert theirs.pk in listed(by_date)


@pytest.mark.parametrize("field", ["id", "recipient", "idempotency_key"])
def test_search_finds_by_exact_id_recipient_or_idempotency_key(superuser, field):
    wanted = NotificationFactory(recipient="grace@example.com", idempotency_key="order-77")
    NotificationFactory(recipient="other@example.com", idempotency_key="order-78")

    response = superuser.get(LIST, {"q": str(getattr(wanted, field))})

    assert listed(response) == {wanted.pk}


def test_search_for_text_that_is_no_id_is_not_an_error(superuser):
    NotificationFactory()
    response = superuser.get(LIST, {"q": "no-such-thing"})
    assert response.status_code == 200
    assert listed(response) == set()


def test_detail_shows_attempts_and_webhook_events_with_the_last_error(superuser):
    notification = NotificationFactory(
        status=Status.DEAD_LETTERED, attempt_count=1, last_error="provider said <503> busy"
    )
    DeliveryAttempt.objects.create(
        notification=notification,
        claim_token="11111111-1111-1111-1111-111111111111",
        number=1,
        channel="email",
        worker="host-a:1:abc",
        started_at=timezone.now(),
        finished_at=timezone.now(),
        outcome=Outcome.TEMPORARY_FAILURE,
        error="timed out after 10s",
    )
    WebhookEventFactory(
        notification=notification,
        state=DeliveryState.FAILED,
        last_error="receiver answered 500",
    )

    response = superuser.get(detail(notification))

    assert response.status_code == 200
    page = response.content.decode()
    assert "provider said &lt;503&gt; busy" in page  # readable, and escaped
    assert "timed out after 10s" in page
    assert "host-a:1:abc" in page
    assert "receiver answered 500" in page
    assert "delivery attempts" in page.lower()
    assert "webhook events" in page.lower()


def test_detail_is_read_only_even_for_a_superuser(superuser):
    notification = NotificationFactory(status=Status.DEAD_LETTERED, attempt_count=6)

    page = superuser.get(detail(notification)).content.decode()
    posted = superuser.post(detail(notification), {"status": "PENDING", "attempt_count": 0})

    assert 'name="_save"' not in page
    assert posted.status_code == 403
    notification.refresh_from_db()
    assert (notification.status, notification.attempt_count) == (Status.DEAD_LETTERED, 6)
    assert superuser.get(f"{LIST}add/").status_code == 403
    assert superuser.get(f"{detail(notification)[:-7]}delete/").status_code == 403


def test_retry_selected_retries_what_it_can_and_says_why_not_the_rest(superuser):
    dead = NotificationFactory(status=Status.DEAD_LETTERED, attempt_count=6, last_error="503")
    failed = NotificationFactory(status=Status.FAILED, attempt_count=1)
    sent = NotificationFactory(status=Status.SENT, attempt_count=1)
    pending = NotificationFactory()

    response = superuser.post(
        LIST,
        {
            "action": "retry_selected",
            "_selected_action": [dead.pk, failed.pk, sent.pk, pending.pk],
        },
        follow=True,
    )

    assert response.status_code == 200
    assert messages_of(response) == [
        "Retried 2 notification(s). Not changed: 1 PENDING, 1 SENT (only FAILED or "
        "DEAD_LETTERED notifications can be retried)."
    ]
    for row in (dead, failed):
        row.refresh_from_db()
        assert (row.status, row.attempt_count, row.operator_retries) == (Status.PENDING, 0, 1)
        assert row.last_retried_by == "admin:ops"
    dead.refresh_from_db()
    assert dead.last_error == "503"
    sent.refresh_from_db()
    assert sent.status == Status.SENT
    logged = LogEntry.objects.values_list("object_id", "change_message")
    assert {object_id for object_id, _ in logged} == {str(dead.pk), str(failed.pk)}


def test_cancel_selected_is_the_apis_conditional_cancel(superuser):
    pending = NotificationFactory()
    other_clients = NotificationFactory(client=ClientFactory(name="globex"))
    sent = NotificationFactory(status=Status.SENT)

    response = superuser.post(
        LIST,
        {
            "action": "cancel_selected",
            "_selected_action": [pending.pk, other_clients.pk, sent.pk],
        },
        follow=True,
    )

    assert messages_of(response) == [
        "Cancelled 2 notification(s). Not changed: 1 SENT (only PENDING notifications can be "
        "cancelled)."
    ]
    statuses = dict(Notification.objects.values_list("id", "status"))
    assert statuses == {
        pending.pk: Status.CANCELLED,
        other_clients.pk: Status.CANCELLED,
        sent.pk: Status.SENT,
    }
    assert LogEntry.objects.count() == 2


@pytest.mark.parametrize(
    ("action", "permission"),
    [("retry_selected", "retry_notification"), ("cancel_selected", "cancel_notification")],
)
def test_each_action_needs_its_own_permission(client, action, permission):
    target = NotificationFactory(
        status=Status.DEAD_LETTERED if action == "retry_selected" else Status.PENDING
    )
    staff = staff_with(client, "view_notification")

    refused = staff.post(LIST, {"action": action, "_selected_action": [target.pk]})
    page = staff.get(LIST).content.decode()

    assert refused.status_code == 200  # the admin answers "no action selected" and changes nothing
    assert f'value="{action}"' not in page
    target.refresh_from_db()
    assert target.operator_retries == 0 and target.status in (Status.DEAD_LETTERED, Status.PENDING)

    User.objects.get(username="staff").user_permissions.add(
        Permission.objects.get(codename=permission)
    )
    granted = staff.post(LIST, {"action": action, "_selected_action": [target.pk]}, follow=True)
    target.refresh_from_db()
    assert target.status in (Status.PENDING, Status.CANCELLED)
    assert messages_of(granted)[0].startswith(("Retried 1", "Cancelled 1"))


def test_non_staff_users_cannot_reach_the_console(client):
    target = NotificationFactory(status=Status.DEAD_LETTERED, attempt_count=6)
    user = User.objects.create_user("someone", password="pw")
    user.user_permissions.add(Permission.objects.get(codename="retry_notification"))
    client.force_login(user)

    listing = client.get(LIST)
    action = client.post(LIST, {"action": "retry_selected", "_selected_action": [target.pk]})

    assert listing.status_code == action.status_code == 302
    assert "/admin/login/" in listing["Location"]
    target.refresh_from_db()
    assert target.status == Status.DEAD_LETTERED


def test_an_action_over_the_limit_changes_nothing_and_points_to_the_bulk_tools(
    superuser, monkeypatch
):
    from notifications import admin as notifications_admin

    monkeypatch.setattr(notifications_admin, "ACTION_LIMIT", 2)
    rows = [NotificationFactory(status=Status.DEAD_LETTERED) for _ in range(3)]

    response = superuser.post(
        LIST,
        {"action": "retry_selected", "_selected_action": [r.pk for r in rows]},
        follow=True,
    )

    assert "At most 2 notifications per action" in messages_of(response)[0]
    assert Notification.objects.filter(status=Status.DEAD_LETTERED).count() == 3


def test_unfiltered_list_uses_the_planner_estimate_not_a_count(superuser):
    client = ClientFactory()
    notifications_insert_bulk(client_id=client.id, count=12_000, status="SENT")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE notification")

    with CaptureQueriesContext(connection) as queries:
        response = superuser.get(LIST)

    assert response.status_code == 200
    counts = [q["sql"] for q in queries.captured_queries if "SELECT COUNT(" in q["sql"].upper()]
    assert counts == []
    assert response.context["cl"].result_count == pytest.approx(12_000, rel=0.05)
    assert len(response.context["cl"].result_list) == 100


def test_pages_reach_the_first_ten_thousand_rows_and_no_deeper(superuser):
    """A page is read with OFFSET, which reads every row before it: the estimate's last page
    would read the whole history. The list offers and serves its first 10,000 rows; a deeper
    page is refused as a page past the end is, and reads nothing."""
    client = ClientFactory()
    notifications_insert_bulk(client_id=client.id, count=12_000, status="SENT")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE notification")

    with CaptureQueriesContext(connection) as queries:
        deepest = superuser.get(LIST, {"p": 100})
    changelist = deepest.context["cl"]
    statements = [q["sql"] for q in queries.captured_queries]
    offsets = [int(s.rsplit("OFFSET", 1)[1]) for s in statements if "OFFSET" in s]
    links = [str(n) for n in changelist.paginator.get_elided_page_range(1)]

    assert changelist.result_count == pytest.approx(12_000, rel=0.05)
    assert changelist.paginator.num_pages == 100
    assert len(changelist.result_list) == 100
    assert offsets == [9_900]
    assert links[-1] == "100"
    with CaptureQueriesContext(connection) as queries:
        deeper = superuser.get(LIST, {"p": 101})
    assert deeper.status_code == 302
    assert deeper["Location"].endswith("?e=1")
    assert not [q for q in queries.captured_queries if "OFFSET" in q["sql"]]

    filtered = superuser.get(LIST, {"status__exact": "SENT", "p": 101})
    assert filtered.status_code == 302


def test_filtered_list_counts_at_most_the_cap(superuser, monkeypatch):
    monkeypatch.setattr(paginators, "LIST_DEPTH", 50)
    client = ClientFactory()
    notifications_insert_bulk(client_id=client.id, count=120)

    response = superuser.get(f"{LIST}?status__exact=DEAD_LETTERED")

    assert response.context["cl"].result_count == 50


def test_dead_letter_filter_reads_the_queue_status_index(superuser):
    """The dead-letter list reads the queue table's status index in order, not the history."""
    client = ClientFactory()
    notifications_insert_bulk(client_id=client.id, count=20_000, status="SENT")
    notifications_insert_bulk(client_id=client.id, count=3_000)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE notification")
        cursor.execute("ANALYZE notification_queue")
        # The list joins each row's client: figures left by earlier tests' clients made the
        # planner expect 15 rows, and sort them instead of reading the index in order.
        cursor.execute("ANALYZE clients_client")

    response = superuser.get(f"{LIST}?status__exact=DEAD_LETTERED")
    page = response.context["cl"].result_list
    plan = page.explain()

    assert len(page) == 100
    assert {row.status for row in page} == {Status.DEAD_LETTERED}
    assert "queue_status" in plan, plan
    assert not history_read_whole(plan) and "Seq Scan on notification " not in plan, plan
    assert "Sort" not in plan, plan


def test_held_rows_show_their_reason_and_time_and_filter_by_reason(superuser):
    later = timezone.now() + timedelta(hours=7)
    quiet = NotificationFactory(due_at=later, quiet_held_since=timezone.now(), user_id="u-1")
    rate = NotificationFactory(due_at=later, rate_deferred_from=timezone.now())
    circuit = NotificationFactory(due_at=later, circuit_held_since=timezone.now())
    plain = NotificationFactory()
    # Marked, but no longer PENDING: not held.
    NotificationFactory(status=Status.SENT, quiet_held_since=timezone.now())

    page = superuser.get(LIST).content.decode()
    assert "quiet_hours until" in page and "rate_limit until" in page
    assert "circuit_open until" in page
    for reason, row in (("quiet_hours", quiet), ("rate_limit", rate), ("circuit_open", circuit)):
        assert listed(superuser.get(LIST, {"held": reason})) == {row.pk}
    assert plain.pk in listed(superuser.get(LIST))
    shown = superuser.get(detail(quiet)).content.decode()
    assert "quiet_hours" in shown
