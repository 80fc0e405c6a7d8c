"""When quiet hours end, as PostgreSQL decides it (`quiet_hours_until`,
preferences/sql/functions/): windows of local wall-clock time read in the user's zone, on the
nights the clocks change in either direction, in zones whose changes are half an hour
(Australia/Lord_Howe) or whose offset is not whole hours (Asia/Kathmandu, +05:45).

The rule: a moment is quiet when the user's wall clock then shows a time inside a window
(start included, end not). A message held then waits until the window ends: the first moment
from then on at which the wall clock shows the end's date and time or later. So a window that
ends at a time the clocks skip ends when they skip it; a window that ends at a time the clocks
show twice ends at its first showing, and a message that falls due in the second showing of a
window's hour is held until the end's second showing. A window that ends where another begins
holds on into it.

PostgreSQL's time zone database alone decides; Python's never does (the last test). Each case
is also checked against a reference written the slow, obvious way with Python's zoneinfo (a
minute at a time): where the two databases agree on a zone's rules, the answers are equal.
"""

from __future__ import annotations

import ast
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from django.db import connection

from notifyqueue.sqlfile import PROJECT

pytestmark = pytest.mark.django_db

NIGHT = [{"start": "22:00", "end": "07:30"}]


def until(now: datetime, zone: str, windows: list[dict], channel: str = "email"):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT quiet_hours_until(%s, %s, %s::jsonb, %s)",
            [now, zone, json.dumps(windows), channel],
        )
        return cursor.fetchone()[0]


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def reference_until(now: datetime, zone: str, windows: list[dict], channel: str = "email"):
    """The rule stepped through a minute at a time with Python's zoneinfo."""
    tz = ZoneInfo(zone)

    def wall(at: datetime) -> datetime:
        return at.astimezone(tz).replace(tzinfo=None)

    def ends(at: datetime) -> list[datetime]:
        """The local date and time at which each window `at` falls in ends."""
        local = wall(at)
        found = []
        for window in windows:
            if "channels" in window and channel not in window["channels"]:
                continue
            start = datetime.strptime(window["start"], "%H:%M").time()
            end = datetime.strptime(window["end"], "%H:%M").time()
            day = local.date()
            if start < end and start <= local.time() < end:
                found.append(datetime.combine(day, end))
            elif start > end and local.time() >= start:
                found.append(datetime.combine(day + timedelta(days=1), end))
            elif start > end and local.time() < end:
                found.append(datetime.combine(day, end))
        return found

    def reached(at: datetime, local_end: datetime) -> datetime:
        while wall(at) < local_end:
            at = (at + timedelta(minutes=1)).replace(second=0, microsecond=0)
        return at

    at, held = now, False
    for _ in range(len(windows)):
        local_ends = ends(at)
        if not local_ends:
            break
        at, held = max(reached(at, local_end) for local_end in local_ends), True
    return at if held else None


# (zone, windows, now in UTC, the end in UTC or None, what it shows)
CASES = [
    # Europe/Berlin: 2026-03-29 02:00 CET becomes 03:00 CEST (01:00 UTC).
    ("Europe/Berlin", NIGHT, "2026-03-28 23:30", "2026-03-29 05:30", "spring: 07:30 CEST"),
    (
        "Europe/Berlin",
        [{"start": "22:00", "end": "02:30"}],
        "2026-03-28 22:00",
        "2026-03-29 01:00",
        "spring: an end the clocks skip ends when they skip it",
    ),
    # 2026-10-25 03:00 CEST becomes 02:00 CET (01:00 UTC): 02:00-03:00 shows twice.
    ("Europe/Berlin", NIGHT, "2026-10-24 21:00", "2026-10-25 06:30", "autumn: 07:30 CET"),
    (
        "Europe/Berlin",
        [{"start": "22:00", "end": "02:30"}],
        "2026-10-24 21:00",
        "2026-10-25 00:30",
        "autumn: a repeated end ends at its first showing",
    ),
    (
        "Europe/Berlin",
        [{"start": "22:00", "end": "02:30"}],
        "2026-10-25 00:45",
        None,
        "autumn: 02:45 CEST, after the first showing, is not quiet",
    ),
    (
        "Europe/Berlin",
        [{"start": "22:00", "end": "02:30"}],
        "2026-10-25 01:10",
        "2026-10-25 01:30",
        "autumn: 02:10 CET, the second showing, is quiet until 02:30 CET",
    ),
    # America/New_York: 2026-03-08 02:00 EST becomes 03:00 EDT; 2026-11-01 02:00 EDT, 01:00 EST.
    (
        "America/New_York",
        [{"start": "23:00", "end": "06:00"}],
        "2026-03-08 04:30",
        "2026-03-08 10:00",
        "spring: 06:00 EDT",
    ),
    (
        "America/New_York",
        [{"start": "23:00", "end": "06:00"}],
        "2026-11-01 03:30",
        "2026-11-01 11:00",
        "autumn: 06:00 EST",
    ),
    (
        "America/New_York",
        [{"start": "01:00", "end": "02:30"}],
        "2026-03-08 06:15",
        "2026-03-08 07:00",
        "spring: 01:15 EST in a window ending in the skipped hour",
    ),
    # Australia/Lord_Howe: 2026-10-04 02:00 +10:30 becomes 02:30 +11; 2026-04-05 02:00 +11
    # becomes 01:30 +10:30.
    (
        "Australia/Lord_Howe",
        [{"start": "22:00", "end": "02:15"}],
        "2026-10-03 12:00",
        "2026-10-03 15:30",
        "half-hour spring: an end in the skipped half hour",
    ),
    ("Australia/Lord_Howe", NIGHT, "2026-10-03 12:00", "2026-10-03 20:30", "half-hour spring"),
    (
        "Australia/Lord_Howe",
        [{"start": "22:00", "end": "01:45"}],
        "2026-04-04 12:00",
        "2026-04-04 14:45",
        "half-hour autumn: the first 01:45 (+11)",
    ),
    (
        "Australia/Lord_Howe",
        [{"start": "22:00", "end": "01:45"}],
        "2026-04-04 15:05",
        "2026-04-04 15:15",
        "half-hour autumn: 01:35 +10:30, the second showing, until 01:45 +10:30",
    ),
    # Asia/Kathmandu, +05:45 all year.
    (
        "Asia/Kathmandu",
        [{"start": "21:00", "end": "06:15"}],
        "2026-12-07 16:00",
        "2026-12-08 00:30",
        "+05:45",
    ),
    # Australia/Sydney: 2026-04-05 03:00 AEDT becomes 02:00 AEST.
    (
        "Australia/Sydney",
        [{"start": "22:00", "end": "02:30"}],
        "2026-04-04 12:00",
        "2026-04-04 15:30",
        "southern autumn: the first 02:30",
    ),
    # Windows and channels.
    ("Europe/Berlin", NIGHT, "2026-12-07 12:00", None, "not inside"),
    ("Europe/Berlin", NIGHT, "2026-12-07 21:00", "2026-12-08 06:30", "start included"),
    ("Europe/Berlin", NIGHT, "2026-12-08 06:30", None, "end not included"),
    (
        "UTC",
        [{"start": "09:00", "end": "17:00"}],
        "2026-12-07 10:00",
        "2026-12-07 17:00",
        "a window that does not cross midnight",
    ),
    (
        "Europe/Berlin",
        [{"start": "22:00", "end": "07:30", "channels": ["sms", "push"]}],
        "2026-12-07 23:00",
        None,
        "a window for other channels",
    ),
    (
        "Europe/Berlin",
        [{"start": "22:00", "end": "07:30", "channels": ["email"]}],
        "2026-12-07 23:00",
        "2026-12-08 06:30",
        "a window for this channel",
    ),
    (
        "Europe/Berlin",
        [*NIGHT, {"start": "07:30", "end": "09:00"}],
        "2026-12-07 23:00",
        "2026-12-08 08:00",
        "a window that ends where another begins holds on into it",
    ),
    (
        "Europe/Berlin",
        [{"start": "23:00", "end": "06:00"}, {"start": "05:00", "end": "08:00"}],
        "2026-12-08 04:30",
        "2026-12-08 07:00",
        "overlapping windows: the later end",
    ),
]


@pytest.mark.parametrize(
    ("zone", "windows", "now", "end", "what"), CASES, ids=[case[-1] for case in CASES]
)
def test_quiet_hours_end_in_the_users_wall_clock_time(zone, windows, now, end, what):
    expected = None if end is None else utc(end)
    assert until(utc(now), zone, windows) == expected, what
    assert reference_until(utc(now), zone, windows) == expected, "zoneinfo disagrees: " + what


ZONES = [
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",
    "Asia/Kathmandu",
    "Australia/Sydney",
    "America/St_Johns",
    "Pacific/Chatham",
]


@pytest.mark.parametrize("zone", ZONES)
def test_every_quarter_hour_of_both_change_nights_agrees_with_the_reference(zone):
    """Around each of 2026's clock changes (or, for a zone without, a plain day), every quarter
    of an hour for a day and a half, against windows that end before, inside and after the
    changed hour: PostgreSQL's answer is the reference's."""
    windows_sets = [
        NIGHT,
        [{"start": "22:00", "end": "02:15"}],
        [{"start": "01:45", "end": "02:45"}],
        [{"start": "00:30", "end": "03:30", "channels": ["email"]}],
    ]
    # A day and a half from each: New York's and St John's changes (March 8, November 1),
    # Berlin's (March 29, October 25), Lord Howe's and Sydney's (April 5, October 4), and
    # Chatham's (April 5, September 27).
    starts = [
        utc(text)
        for text in (
            "2026-03-07 12:00",
            "2026-03-28 12:00",
            "2026-04-04 06:00",
            "2026-09-26 06:00",
            "2026-10-03 06:00",
            "2026-10-24 12:00",
            "2026-10-31 18:00",
        )
    ]
    disagreements = []
    for start in starts:
        for quarter in range(4 * 36):
            now = start + timedelta(minutes=15 * quarter)
            for windows in windows_sets:
                got, want = until(now, zone, windows), reference_until(now, zone, windows)
                if got != want:
                    disagreements.append((now.isoformat(), windows, got, want))
    assert disagreements == []


def test_a_window_that_covers_the_whole_day_holds_until_its_last_end_and_is_asked_again_then():
    whole_day = [{"start": "00:00", "end": "12:00"}, {"start": "12:00", "end": "00:00"}]
    assert until(utc("2026-12-07 23:00"), "Europe/Berlin", whole_day) == utc("2026-12-08 23:00")


def test_no_windows_and_a_critical_claim_are_never_held():
    assert until(utc("2026-12-07 23:00"), "Europe/Berlin", []) is None


def test_only_postgresql_turns_wall_clock_times_into_instants():
    """The product's code never reads Python's time zone database (zoneinfo, pytz, dateutil):
    a worker whose Python carries other rules than the server's still holds what the server
    says. (These tests use zoneinfo only as the reference above.)"""
    readers = []
    for app in (
        "notifyqueue",
        "notifications",
        "delivery",
        "preferences",
        "health",
        "clients",
        "ratelimits",
        "templates",
        "webhooks",
        "monitoring",
    ):
        for path in (PROJECT / app).rglob("*.py"):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                names = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                if any(n.split(".")[0] in {"zoneinfo", "pytz", "dateutil"} for n in names):
                    readers.append(str(Path(path).relative_to(PROJECT)))
    assert readers == []
