"""The admin and the API docs, as gunicorn serves them in production, render in a real browser
with no network but loopback.

gunicorn runs with the production settings (no development switch; a secret key; the files of
`manage.py collectstatic` served by WhiteNoise), only HTTPS enforcement is off because the test
speaks plain HTTP. Debian's chromium, driven by Playwright, may reach 127.0.0.1 only: every
other request is refused and recorded (and host names do not resolve), and the test asserts
that none was attempted. Rendering is checked in the page, not by status codes: the admin's
stylesheet is applied (computed colours), Swagger UI lists the operations and ReDoc its menu.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.db import connection

from tests.support.browser import LAUNCH_ARGS as BROWSER_ARGS
from tests.support.factories import ClientFactory, NotificationFactory
from tests.support.gunicorn_server import gunicorn_serving

ROOT = Path(__file__).resolve().parents[2]
LAUNCH_ARGS = [
    *BROWSER_ARGS,
    # Nothing but loopback resolves, whatever a page asks for.
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
]
# Django admin's header colour (--header-bg, #417690) once admin/css/base.css is applied.
ADMIN_HEADER_BACKGROUND = "rgb(65, 118, 144)"
PASSWORD = "correct horse battery"

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def production_server(database_url, tmp_path):
    """gunicorn with production settings and collected static files; yields its base URL."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"NOTIFYQUEUE_DEV_EMBEDDED_DB", "PROMETHEUS_MULTIPROC_DIR"}
    }
    env.update(
        DATABASE_URL=database_url,
        DJANGO_SECRET_KEY=secrets.token_urlsafe(50),
        DJANGO_STATIC_ROOT=str(tmp_path / "static"),
        # Plain HTTP on loopback: the HTTPS-only defaults would redirect and drop cookies.
        DJANGO_SECURE_SSL_REDIRECT="false",
        DJANGO_SESSION_COOKIE_SECURE="false",
        DJANGO_CSRF_COOKIE_SECURE="false",
        DJANGO_SECURE_HSTS_SECONDS="0",
    )
    subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--no-input", "--verbosity", "0"],
        cwd=ROOT,
        env=env,
        check=True,
    )
    with gunicorn_serving(env, workers=2) as base:
        yield base
    other_sessions_wait_gone()


def other_sessions_wait_gone(timeout_s: float = 10.0) -> None:
    """PostgreSQL ends a closed connection's backend a moment later; the test database can be
    dropped (or flushed) only once gunicorn's sessions are really gone."""
    deadline = time.monotonic() + timeout_s
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            if cursor.fetchone()[0] == 0:
                return
            time.sleep(0.05)
    raise AssertionError("gunicorn's database sessions outlived it")


@pytest.fixture
def offline_page(chromium, tmp_path, monkeypatch):
    """A chromium page that may load from 127.0.0.1 only; yields (page, refused URLs)."""
    sync_api = pytest.importorskip("playwright.sync_api")
    # Playwright's sync API runs an event loop on this thread; the ORM is used only before.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    refused: list[str] = []

    def only_loopback(route):
        if urllib.parse.urlsplit(route.request.url).hostname == "127.0.0.1":
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort("internetdisconnected")

    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=chromium,
            args=LAUNCH_ARGS,
            headless=True,
        )
        try:
            browser.route("**/*", only_loopback)
            page = browser.new_page()
            page.set_default_timeout(20_000)
            yield page, refused
        finally:
            browser.close()


def stylesheets_loaded(page) -> int:
    """How many stylesheets the page applied (each with rules, so its file really arrived)."""
    return page.evaluate(
        "() => [...document.styleSheets].filter(s => s.cssRules.length > 0).length"
    )


@pytest.fixture
def operator_and_a_notification():
    # Made before the browser starts: Playwright's sync API runs the test in a greenlet, where
    # the ORM would open (and leave open) a connection of its own.
    User.objects.create_superuser("operator", "operator@localhost", PASSWORD)
    NotificationFactory(client=ClientFactory(name="acme"), recipient="ada@example.com")


def test_admin_is_styled_and_lists_notifications_offline(
    operator_and_a_notification, production_server, offline_page
):
    page, refused = offline_page

    page.goto(f"{production_server}/admin/login/?next=/admin/notifications/notification/")
    assert stylesheets_loaded(page) >= 2
    header = page.eval_on_selector("#header", "e => getComputedStyle(e).backgroundColor")
    assert header == ADMIN_HEADER_BACKGROUND

    page.fill("#id_username", "operator")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url("**/admin/notifications/notification/")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 1
    assert "ada@example.com" in rows.first.inner_text()
    filter_panel = page.eval_on_selector(
        "#changelist-filter",
        "e => getComputedStyle(e).position + ' ' + getComputedStyle(e).display",
    )
    assert filter_panel != "static inline"  # the unstyled default of a <nav>/<div>
    assert page.eval_on_selector("#header", "e => getComputedStyle(e).backgroundColor") == (
        ADMIN_HEADER_BACKGROUND
    )
    assert refused == []


def test_swagger_ui_lists_the_operations_offline(production_server, offline_page):
    page, refused = offline_page

    page.goto(f"{production_server}/api/docs/")
    page.wait_for_selector(".opblock")
    paths = page.locator(".opblock-summary-path").all_inner_texts()
    assert "/api/v1/notifications" in [p.replace("\u200b", "") for p in paths]
    assert page.locator(".opblock").count() >= 10
    assert stylesheets_loaded(page) >= 1
    # swagger-ui.css colours each POST operation's method badge green (#49cc90).
    post_badge = page.eval_on_selector(
        ".opblock-post .opblock-summary-method", "e => getComputedStyle(e).backgroundColor"
    )
    assert post_badge == "rgb(73, 204, 144)"
    assert refused == []


def test_redoc_renders_the_reference_offline(production_server, offline_page):
    page, refused = offline_page

    page.goto(f"{production_server}/api/redoc/")
    page.wait_for_selector("h1")
    assert "Notify Queue API" in page.inner_text("h1")
    menu = page.locator("[role=menuitem]")
    menu.first.wait_for()
    assert menu.count() >= 10
    assert refused == []
