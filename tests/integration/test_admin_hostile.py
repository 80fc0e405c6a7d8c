"""The operators' console against a hostile page or a hostile colleague: every state-changing
action needs Django's CSRF token (a forged cross-site POST from a logged-in operator's browser
changes nothing), and each needs its own permission, whatever else a staff user may do."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.test import Client as BrowserClient

from clients.models import Client, ClientAPIKey
from notifications.models import Notification, Status
from tests.support.factories import ClientFactory, NotificationFactory
from tests.support.webhook_factories import WebhookEventFactory
from webhooks.models import DeliveryState, WebhookEvent

pytestmark = pytest.mark.django_db


def world() -> dict:
    """One row for each action to act on, and what each action would change."""
    client = ClientFactory(name="target")
    api_key, _ = ClientAPIKey.objects.create_key(name="target key", client=client)
    dead = NotificationFactory(client=client, status=Status.DEAD_LETTERED, attempt_count=6)
    pending = NotificationFactory(client=client)
    event = WebhookEventFactory(notification=dead, state=DeliveryState.FAILED)
    return {
        "retry_selected": ("/admin/notifications/notification/", dead.pk),
        "cancel_selected": ("/admin/notifications/notification/", pending.pk),
        "redeliver_selected": ("/admin/webhooks/webhookevent/", event.pk),
        "revoke_selected": ("/admin/clients/clientapikey/", api_key.pk),
        "rotate_webhook_secret_selected": ("/admin/clients/client/", client.pk),
    }


def snapshot() -> tuple:
    return (
        sorted(Notification.objects.values_list("id", "status", "operator_retries")),
        sorted(WebhookEvent.objects.values_list("id", "state", "attempt_count")),
        sorted(ClientAPIKey.objects.values_list("id", "revoked")),
        sorted(Client.objects.values_list("id", "webhook_secret")),
        LogEntry.objects.count(),
    )


def post_action(browser: BrowserClient, url: str, action: str, pk) -> int:
    return browser.post(url, {"action": action, "_selected_action": [pk]}).status_code


def test_every_admin_action_without_the_csrf_token_is_refused_and_changes_nothing():
    actions = world()
    operator = User.objects.create_superuser("ops", "ops@example.com", "pw")
    browser = BrowserClient(enforce_csrf_checks=True)
    browser.force_login(operator)
    before = snapshot()

    for action, (url, pk) in actions.items():
        assert browser.get(url).status_code == 200  # the session is good
        assert post_action(browser, url, action, pk) == 403, action
        # A token that is not this session's is no better.
        forged = browser.post(
            url,
            {"action": action, "_selected_action": [pk], "csrfmiddlewaretoken": "x" * 64},
        )
        assert forged.status_code == 403, action

    assert snapshot() == before


def test_the_admin_login_form_needs_the_csrf_token():
    User.objects.create_superuser("ops", "ops@example.com", "pw")
    browser = BrowserClient(enforce_csrf_checks=True)
    answer = browser.post("/admin/login/", {"username": "ops", "password": "pw"})
    assert answer.status_code == 403
    assert "_auth_user_id" not in browser.session


@pytest.mark.parametrize(
    "permissions",
    [
        (),
        ("view_notification", "view_webhookevent", "view_clientapikey", "view_client"),
        # May edit a client's name and webhook, yet not act on keys it cannot change.
        ("view_notification", "view_webhookevent", "view_clientapikey", "change_client"),
    ],
    ids=["no-permission", "view-only", "change-client-only"],
)
def test_a_staff_user_cannot_run_an_action_it_has_no_permission_for(permissions):
    actions = world()
    staff = User.objects.create_user("staff", password="pw", is_staff=True)
    for codename in permissions:
        staff.user_permissions.add(Permission.objects.get(codename=codename))
    browser = BrowserClient()
    browser.force_login(staff)
    granted = {
        "rotate_webhook_secret_selected": "change_client" in permissions,
    }
    before = snapshot()

    for action, (url, pk) in actions.items():
        if granted.get(action):
            continue
        status = post_action(browser, url, action, pk)
        # 403 without even the view permission; with it, the admin answers "no action
        # selected" (200, or a redirect back to the list) and runs nothing.
        assert status in (200, 302, 403), (action, status)
        page = browser.get(url)
        assert page.status_code in (200, 403)
        assert f'value="{action}"' not in page.content.decode()
    assert browser.get("/admin/clients/clientapikey/add/").status_code == 403

    after = snapshot()
    if granted["rotate_webhook_secret_selected"]:
        after = (*after[:3], before[3], after[4])
    assert after == before


def test_someone_without_staff_status_is_sent_to_the_login_page_for_every_action():
    actions = world()
    user = User.objects.create_user("someone", password="pw")
    for codename in ("retry_notification", "cancel_notification", "change_clientapikey"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    browser = BrowserClient()
    browser.force_login(user)
    before = snapshot()

    for action, (url, pk) in actions.items():
        answer = browser.post(url, {"action": action, "_selected_action": [pk]})
        assert answer.status_code == 302 and answer["Location"].startswith("/admin/login/")
    assert snapshot() == before


def test_a_clients_content_is_shown_escaped_in_the_console(superuser):
    """What a client wrote (subject, body, recipient, metadata, template text, preferences)
    and what a provider answered reach the operators' pages as text, never as markup."""
    from django.utils import timezone

    from preferences.models import UserPreferences
    from templates.models import MessageTemplate

    script = "<script>alert(1)</script>"
    client = ClientFactory(name=f"{script} inc")
    notification = NotificationFactory(
        client=client,
        channel="in_app",
        recipient=script,
        subject=script,
        body=script,
        metadata={script: script},
        last_error=script,
    )
    WebhookEventFactory(notification=notification)
    now = timezone.now()
    MessageTemplate.objects.create(
        client=client,
        event="welcome",
        channel="email",
        subject=script,
        body=script,
        created_at=now,
        updated_at=now,
    )
    UserPreferences.objects.create(
        client=client,
        user_id=script,
        channels=["in_app"],
        addresses={},
        muted_events=[script],
        created_at=now,
        updated_at=now,
    )
    pages = [
        "/admin/notifications/notification/",
        f"/admin/notifications/notification/{notification.pk}/change/",
        "/admin/webhooks/webhookevent/",
        "/admin/message_templates/messagetemplate/",
        "/admin/preferences/userpreferences/",
        "/admin/clients/client/",
    ]
    for url in pages:
        page = superuser.get(url, {"q": script})
        assert page.status_code == 200, url
        assert script not in page.content.decode(), url
    change = superuser.get(pages[1]).content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in change
