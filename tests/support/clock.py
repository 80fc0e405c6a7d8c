"""Moving time from the database side, as every process sees it.

The service decides due times, claim expiry, reaping and rate windows with the SQL function
`notifyqueue_now()` (notifyqueue/sql/functions/notifyqueue_now.sql). `DbClock` replaces that
function with one that returns a time the test sets, so every connection and every worker
process (whatever its own clock says) sees the same frozen, hand-moved time. `restore()` puts
the real clock back by running that file again; the autouse fixture in conftest.py does it
after every test that made one.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import connection

from notifyqueue.sqlfile import database_object_path

REAL = database_object_path("notifyqueue/sql/functions/notifyqueue_now.sql")


def _install(body: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE OR REPLACE FUNCTION notifyqueue_now() RETURNS timestamptz "
            f"LANGUAGE sql STABLE PARALLEL SAFE AS $$ {body} $$"
        )


def database_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT notifyqueue_now()")
        return cursor.fetchone()[0]


class DbClock:
    """The database's clock, frozen at `now` until the test moves it."""

    installed = False

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or database_now()
        self._set(self._now)

    def __call__(self) -> datetime:
        return self._now

    @property
    def now(self) -> datetime:
        return self._now

    @now.setter
    def now(self, value: datetime) -> None:
        self._set(value)

    def advance(self, seconds: float) -> None:
        self._set(self._now + timedelta(seconds=seconds))

    def _set(self, value: datetime) -> None:
        self._now = value
        _install(f"SELECT '{value.isoformat()}'::timestamptz")
        DbClock.installed = True

    @staticmethod
    def restore() -> None:
        with connection.cursor() as cursor:
            cursor.execute(REAL.read_text())
        DbClock.installed = False
