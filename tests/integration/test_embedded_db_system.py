"""The embedded database on PostgreSQL's own binaries, the route of every Python without
pgserver's wheels (Debian's PostgreSQL 15 under /usr/lib/postgresql/15/bin, off PATH): from a
fresh data folder through the restart its settings need, then every migration and one
notification delivered, on that server's version while the rest of the suite runs on
pgserver's."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from notifyqueue import embedded_db

ROOT = Path(__file__).resolve().parents[2]
# Generous: the first start runs initdb and a restart; a hang (a pipe the server keeps open)
# ends here instead of holding the suite.
STEP_TIMEOUT_S = 180

pytestmark = pytest.mark.slow


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """A fresh state folder outside the checkout, short enough for a socket path and open to
    the `postgres` account that runs the server when the tests run as root."""
    if embedded_db.postgres_bin_dir() is None:
        pytest.skip(
            "PostgreSQL's own initdb/pg_ctl are not on PATH nor under "
            f"{embedded_db.DEBIAN_BIN_DIRS} (python3 dev.py test installs Debian's postgresql "
            "with apt-get when run as root, unless NOTIFYQUEUE_DEV_NO_APT=1)"
        )
    path = Path(tempfile.mkdtemp(prefix="nq-pg-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        run_embedded_db("stop", "--state-dir", str(path))
        shutil.rmtree(path, ignore_errors=True)


def run_embedded_db(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "notifyqueue.embedded_db", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=STEP_TIMEOUT_S,
    )


def manage(*args: str, env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=STEP_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


CREATE_ONE = """
import json, os
from rest_framework.test import APIClient
http = APIClient()
http.credentials(HTTP_AUTHORIZATION="Api-Key " + os.environ["NQ_TEST_KEY"])
answer = http.post(
    "/api/v1/notifications",
    {"channel": "email", "recipient": "ada@example.com", "body": "hello from PostgreSQL"},
    format="json",
    HTTP_IDEMPOTENCY_KEY="system-binaries-1",
)
assert answer.status_code == 201, answer.content
print(answer.json()["id"])
"""


def path_without_postgresql() -> str:
    """PATH without the folders holding pg_ctl, when Debian's folder has one: the binaries
    are then found where Debian puts them, as on a machine that never put them on PATH."""
    folders = os.environ.get("PATH", "").split(os.pathsep)
    if not glob.glob(f"{embedded_db.DEBIAN_BIN_DIRS}/pg_ctl"):
        return os.pathsep.join(folders)
    return os.pathsep.join(f for f in folders if not (Path(f) / "pg_ctl").exists())


def test_a_fresh_server_from_postgresqls_own_binaries_migrates_and_delivers(state_dir):
    started = run_embedded_db(
        *("start", "--state-dir", str(state_dir), "--server", "system"),
        env={**os.environ, "PATH": path_without_postgresql()},
    )
    assert started.returncode == 0, started.stderr
    url = started.stdout.strip()
    assert f"host={state_dir}/pgdata-system" in url
    with psycopg.connect(url) as conn:
        version, wal_level = conn.execute(
            "SELECT current_setting('server_version'), current_setting('wal_level')"
        ).fetchone()
    assert wal_level == "minimal"  # the settings that needed the restart are in force
    print(f"PostgreSQL's own binaries: server {version}")

    env = {
        **{k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"},
        "DATABASE_URL": url,
        "NOTIFYQUEUE_DEV_EMBEDDED_DB": "1",
    }
    manage("migrate", "--no-input", env=env)
    key = json.loads(manage("create_client", "system-binaries", env=env))["api_key"]
    created = manage("shell", "-c", CREATE_ONE, env={**env, "NQ_TEST_KEY": key})
    notification_id = created.strip().splitlines()[-1]  # after what the shell says
    manage("run_worker", "--until-empty", env=env)

    with psycopg.connect(url) as conn:
        status = conn.execute(
            "SELECT status FROM notification WHERE id = %s", (notification_id,)
        ).fetchone()
    assert status == ("SENT",)
