"""End to end in a real headless browser: an operator logs into the admin, opens the
dead-letter queue, retries one notification with the action, and sees it PENDING.

Debian's chromium (`/usr/bin/chromium`) is driven by Playwright; no browser is downloaded.
`python3 dev.py test` installs chromium with apt-get where it is missing; this test skips
only when that was not possible.
"""

from __future__ import annotations

import shutil

import pytest
from django.contrib.auth.models import Permission, User

from notifications.models import Notification, Status
from tests.support.browser import LAUNCH_ARGS as BROWSER_ARGS
from tests.support.factories import ClientFactory, NotificationFactory

LAUNCH_ARGS = ["--headless", *BROWSER_ARGS]

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def operator_user():
    user = User.objects.create_user("oncall", password="correct horse battery", is_staff=True)
    for codename in ("view_notification", "retry_notification"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


def test_operator_retries_a_dead_letter_from_the_admin_in_a_real_browser(
    chromium, operator_user, live_server, tmp_path, monkeypatch
):
    sync_api = pytest.importorskip("playwright.sync_api")
    client = ClientFactory(name="acme")
    dead = NotificationFactory(
        client=client,
        recipient="dead-letter@example.com",
        status=Status.DEAD_LETTERED,
        attempt_count=6,
        last_error="provider answered 503: busy",
    )
    NotificationFactory(client=client, recipient="delivered@example.com", status=Status.SENT)
    # Playwright's sync API runs an event loop on this thread; the live server's ORM work is
    # on its own thread, and this test touches the ORM only outside the browser session.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

    profile = tmp_path / "chromium-profile"
    with sync_api.sync_playwright() as playwright:
        # A fresh profile directory each run (Playwright's form of --user-data-dir).
        browser = playwright.chromium.launch_persistent_context(
            str(profile), executable_path=chromium, args=LAUNCH_ARGS, headless=True
        )
        try:
            page = browser.new_page()
            page.set_default_timeout(15_000)
            page.goto(f"{live_server.url}/admin/login/?next=/admin/notifications/notification/")
            page.fill("#id_username", "oncall")
            page.fill("#id_password", "correct horse battery")
            page.click("input[type=submit]")
            page.wait_for_url("**/admin/notifications/notification/")

            # The dead-letter queue is one click on the status filter.
            page.locator("#changelist-filter").get_by_role("link", name="Dead Lettered").click()
            page.wait_for_url("**status__exact=DEAD_LETTERED**")
            rows = page.locator("#result_list tbody tr")
            assert rows.count() == 1
            assert "dead-letter@example.com" in rows.first.inner_text()

            page.check(f"input[name=_selected_action][value='{dead.pk}']")
            page.select_option("select[name=action]", "retry_selected")
            page.click("button[name=index]")
            page.wait_for_selector(".messagelist")
            assert "Retried 1 notification(s)." in page.inner_text(".messagelist")

            page.goto(f"{live_server.url}/admin/notifications/notification/{dead.pk}/change/")
            assert "PENDING" in page.inner_text("body")
            assert "provider answered 503: busy" in page.inner_text("body")
        finally:
            browser.close()
    shutil.rmtree(profile, ignore_errors=True)

    dead.refresh_from_db()
    assert (dead.status, dead.attempt_count, dead.operator_retries) == (Status.PENDING, 0, 1)
    assert dead.last_retried_by == "admin:oncall"
    assert Notification.objects.filter(status=Status.SENT).count() == 1
