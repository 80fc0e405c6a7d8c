#!/usr/bin/env python
"""Measures what the SQL gateway (notifyqueue.sqlgateway) adds to a query, against a bare cursor.

    .venv/bin/python bench/sql_gateway.py --calls 4000 --rounds 5

Runs three small queries, and a worker claim's rows (100 rows of the claim's 15 columns, built
from VALUES, not read from the queue), both ways on the configured database (the embedded one
unless DATABASE_URL is set): through Django's cursor with positional unpacking (and json.loads
for jsonb), and through the gateway (rows built by name). Times the client process's CPU per call
(`time.process_time`), so the database's share and the machine's other load count for little.
Touches no table. Prints its figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "notifyqueue.settings")

import django  # noqa: E402

django.setup()

from django.db import connection  # noqa: E402

from delivery.repositories import Claim  # noqa: E402
from notifyqueue.sqlgateway import Queries  # noqa: E402

SQL = """
-- name: one
SELECT 1;

-- name: circuits
SELECT name, state, consecutive_failures, opened_at
FROM (VALUES ('email:http', 'CLOSED', 0, now()), ('sms:http', 'OPEN', 3, now()))
     AS c(name, state, consecutive_failures, opened_at);

-- name: settings
SELECT '{"channels": ["email", "sms"], "quiet": true}'::jsonb AS settings;

-- name: claims
-- The columns of notification_claim_due, in its order.
SELECT gen_random_uuid() AS id, gen_random_uuid() AS claim_token, gen_random_uuid() AS client_id,
       'email' AS channel, 'user' || g || '@example.com' AS recipient, 'Hi' AS subject,
       'Your code is 123456' AS body, '{"order": "A-17"}'::jsonb AS metadata, 2 AS priority,
       1 AS attempt_count, 6 AS max_attempts, NULL::text AS user_id, NULL::text AS template,
       NULL::jsonb AS payload, '["sms"]'::jsonb AS fallback_channels
FROM generate_series(1, 100) AS g;
"""


@dataclass(frozen=True)
class Circuit:
    name: str
    state: str
    consecutive_failures: int
    opened_at: datetime


@dataclass(frozen=True)
class Settings:
    settings: dict[str, Any]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=4000, help="calls per round and case")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "bench.sql"
        path.write_text(SQL)
        queries = Queries(path)

    def bare(name: str, build):
        def run():
            with connection.cursor() as cursor:
                cursor.execute(queries[name], {})
                return [build(row) for row in cursor.fetchall()]

        return run

    cases = [
        ("SELECT 1: cursor, row[0]", bare("one", lambda row: row[0])),
        ("SELECT 1: gateway scalar()", lambda: queries.scalar("one")),
        ("2 rows x 4 columns: cursor, Circuit(*row)", bare("circuits", lambda row: Circuit(*row))),
        ("2 rows x 4 columns: gateway rows()", lambda: queries.rows("circuits", row=Circuit)),
        (
            "1 jsonb row: cursor, json.loads",
            bare("settings", lambda row: Settings(json.loads(row[0]))),
        ),
        ("1 jsonb row: gateway rows()", lambda: queries.rows("settings", row=Settings)),
        # As a repository builds rows by position, without the gateway.
        (
            "100 claim rows: cursor, Claim(*row[:7], ...)",
            bare(
                "claims",
                lambda row: Claim(
                    *row[:7],
                    json.loads(row[7]),
                    *row[8:11],
                    user_id=row[11],
                    template=row[12],
                    payload=None if row[13] is None else json.loads(row[13]),
                    fallback_channels=tuple(json.loads(row[14])),
                ),
            ),
        ),
        ("100 claim rows: gateway rows()", lambda: queries.rows("claims", row=Claim)),
    ]
    timings: dict[str, list[float]] = {name: [] for name, _ in cases}
    for _ in range(args.rounds):
        for name, run in cases:
            for _ in range(100):
                run()
            # A 100-row case runs a tenth as often.
            calls = args.calls // 10 if name.startswith("100 ") else args.calls
            started = time.process_time()
            for _ in range(calls):
                run()
            timings[name].append((time.process_time() - started) / calls * 1e6)
    for name, values in timings.items():
        rounds = ", ".join(f"{value:.0f}" for value in values)
        print(f"{name:46s} median {statistics.median(values):6.1f} µs CPU/call ({rounds})")


if __name__ == "__main__":
    main()
