"""The embedded PostgreSQL of development and tests keeps its WAL small."""

from __future__ import annotations

import pytest
from django.db import connection

from notifyqueue import embedded_db


@pytest.mark.django_db
def test_the_embedded_server_runs_with_minimal_and_bounded_wal():
    if not str(connection.settings_dict["HOST"]).startswith(str(embedded_db.STATE_DIR)):
        pytest.skip("the tests run on DATABASE_URL's server, not the embedded one")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s)",
            [list(embedded_db.EMBEDDED_SERVER_SETTINGS)],
        )
        running = dict(cursor.fetchall())

    assert running == {
        "wal_level": "minimal",
        "max_wal_senders": "0",
        "max_wal_size": "64MB",
        "min_wal_size": "32MB",
        "checkpoint_timeout": "1min",
        "wal_keep_size": "0",
    }
