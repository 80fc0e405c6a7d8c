"""Production refuses insecure defaults: no database nor secret key unless given, or unless the
development switch (set by dev.py and the tests) asks for the embedded server and a dev key.

Each case is a real `manage.py` process with a controlled environment.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEVELOPMENT_AND_PRODUCTION_VARIABLES = (
    "NOTIFYQUEUE_DEV_EMBEDDED_DB",
    "DATABASE_URL",
    "DJANGO_SECRET_KEY",
    "DJANGO_DEBUG",
    "DJANGO_ALLOWED_HOSTS",
    "NOTIFYQUEUE_PUBLIC_URL",
    "NOTIFYQUEUE_UNSUBSCRIBE_SECRET",
)


def manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in DEVELOPMENT_AND_PRODUCTION_VARIABLES}
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("command", ["check", "migrate", "makemigrations", "run_worker"])
def test_without_database_url_or_the_development_switch_a_command_stops_with_a_message(command):
    result = manage(command)

    assert result.returncode == 1
    assert "DATABASE_URL is not set" in result.stderr
    assert "Traceback" not in result.stderr


def test_help_needs_no_database():
    result = manage("--help")

    assert result.returncode == 0, result.stderr
    assert "Available subcommands" in result.stdout
    assert "DATABASE_URL is not set" in result.stdout


def test_without_a_secret_key_production_stops_with_a_message(database_url):
    result = manage("check", DATABASE_URL=database_url)

    assert result.returncode == 1
    assert "DJANGO_SECRET_KEY is not set" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.django_db
def test_check_deploy_is_clean_with_the_documented_production_variables(database_url):
    # The variables docs/operations.md lists under "Production settings".
    result = manage(
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        DATABASE_URL=database_url,
        DJANGO_SECRET_KEY=secrets.token_urlsafe(50),
        DJANGO_ALLOWED_HOSTS="notify.example.com",
        NOTIFYQUEUE_PUBLIC_URL="https://notify.example.com",
        NOTIFYQUEUE_UNSUBSCRIBE_SECRET=secrets.token_urlsafe(50),
    )

    assert result.returncode == 0, result.stderr
    assert "System check identified no issues" in result.stdout


@pytest.mark.django_db
def test_check_deploy_warns_that_emails_carry_no_unsubscribe_link_without_a_public_url(
    database_url,
):
    result = manage(
        "check",
        "--deploy",
        DATABASE_URL=database_url,
        DJANGO_SECRET_KEY=secrets.token_urlsafe(50),
        DJANGO_ALLOWED_HOSTS="notify.example.com",
    )
    assert "receipts.W001" in result.stderr + result.stdout
    assert "List-Unsubscribe" in result.stderr + result.stdout


def test_gunicorn_without_database_url_stops_with_the_message():
    clean = {k: v for k, v in os.environ.items() if k not in DEVELOPMENT_AND_PRODUCTION_VARIABLES}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "-c",
            "python:notifyqueue.gunicorn_conf",
            "--bind",
            "127.0.0.1:0",
            "--workers",
            "1",
        ],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode != 0
    assert "DATABASE_URL is not set" in result.stderr


def test_an_app_registry_error_with_sound_settings_keeps_its_traceback(monkeypatch):
    """The settings' message replaces AppRegistryNotReady only when the settings failed."""
    from django.core import management
    from django.core.exceptions import AppRegistryNotReady

    from notifyqueue import cli

    def broken(argv):
        raise AppRegistryNotReady("a command bug")

    monkeypatch.setattr(management, "execute_from_command_line", broken)
    with pytest.raises(AppRegistryNotReady, match="a command bug"):
        cli.main(["manage.py", "check"])


def test_a_multi_host_database_url_reaches_libpq_as_host_and_port_lists():
    """libpq's failover form (docs/deploying.md): django-environ keeps the hosts and ports as
    comma-separated lists and the query's options, and the PostgreSQL backend hands them to
    libpq as they are. (The failover itself: tests/faults/test_failover.py.)"""
    url = (
        "postgresql://notifyqueue:s%40cret@db-a.internal:5432,db-b.internal:5433/notifyqueue"
        "?target_session_attrs=read-write&connect_timeout=5"
    )
    shown = (
        "import json; from django.db import connection; "
        "p = connection.get_connection_params(); "
        "print(json.dumps({k: p.get(k) for k in "
        "('host', 'port', 'dbname', 'user', 'password', 'target_session_attrs', "
        "'connect_timeout')}))"
    )
    result = manage(
        "shell", "-c", shown, DATABASE_URL=url, DJANGO_SECRET_KEY=secrets.token_urlsafe(50)
    )

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == {
        "host": "db-a.internal,db-b.internal",
        "port": "5432,5433",
        "dbname": "notifyqueue",
        "user": "notifyqueue",
        "password": "s@cret",
        "target_session_attrs": "read-write",
        "connect_timeout": 5,
    }
