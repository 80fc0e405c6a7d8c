"""The preferences' `timezone` and `quiet_hours` over the API: stored and shown as given (the
zone in PostgreSQL's spelling), defaults for preferences written without them, and every bad
value a 400 in the JSON error format that names the field and changes nothing."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from preferences.models import UserPreferences

pytestmark = pytest.mark.django_db

BASE = {"channels": ["email"], "addresses": {"email": "ada@example.com"}}
NIGHT = {"start": "22:00", "end": "07:30"}


def put(api: APIClient, **fields):
    return api.put("/api/v1/users/u-1/preferences", {**BASE, **fields}, format="json")


def test_timezone_and_quiet_hours_are_stored_and_shown_as_given(api):
    windows = [NIGHT, {"start": "12:00", "end": "13:00", "channels": ["push", "sms"]}]
    response = put(api, timezone="Europe/Berlin", quiet_hours=windows)
    assert response.status_code == 201, response.json()
    assert (response.json()["timezone"], response.json()["quiet_hours"]) == (
        "Europe/Berlin",
        windows,
    )
    got = api.get("/api/v1/users/u-1/preferences").json()
    assert (got["timezone"], got["quiet_hours"]) == ("Europe/Berlin", windows)


def test_preferences_without_them_are_utc_with_no_quiet_hours(api):
    assert put(api).status_code == 201
    got = api.get("/api/v1/users/u-1/preferences").json()
    assert (got["timezone"], got["quiet_hours"]) == ("UTC", [])
    # A row written by a process that names neither column (the previous release) gets them too.
    UserPreferences.objects.filter(user_id="u-1").delete()
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO user_preferences (id, client_id, user_id, channels, addresses, "
            "muted_events, disabled_channels, created_at, updated_at) "
            "SELECT gen_random_uuid(), id, 'u-1', '[]', '{}', '[]', '[]', now(), now() "
            "FROM clients_client LIMIT 1"
        )
    got = api.get("/api/v1/users/u-1/preferences").json()
    assert (got["timezone"], got["quiet_hours"]) == ("UTC", [])


def test_a_timezone_is_stored_as_postgresql_spells_it(api):
    response = put(api, timezone="asia/KATHMANDU")
    assert response.status_code == 201, response.json()
    assert response.json()["timezone"] == "Asia/Kathmandu"


BAD = [
    ({"timezone": "Mars/Olympus_Mons"}, "timezone"),
    ({"timezone": "foo+3"}, "timezone"),  # a POSIX rule PostgreSQL would read, not a zone
    ({"timezone": "+05:45"}, "timezone"),
    ({"timezone": ""}, "timezone"),
    ({"timezone": "Europe/Berlin\x00"}, "timezone"),
    ({"timezone": "E" * 4096}, "timezone"),
    ({"timezone": None}, "timezone"),
    ({"timezone": 3}, "timezone"),
    ({"quiet_hours": [{"start": "22:00", "end": "22:00"}]}, "quiet_hours"),
    ({"quiet_hours": [{"start": "7:30", "end": "22:00"}]}, "quiet_hours"),
    ({"quiet_hours": [{"start": "24:00", "end": "07:00"}]}, "quiet_hours"),
    ({"quiet_hours": [{"start": "22:00:00", "end": "07:00"}]}, "quiet_hours"),
    ({"quiet_hours": [{"start": "22:60", "end": "07:00"}]}, "quiet_hours"),
    ({"quiet_hours": [{"start": "22:00\n", "end": "07:00\u2028"}]}, "quiet_hours"),
    (
        {"quiet_hours": [{"start": "\uff12\uff12:\uff10\uff10", "end": "07:00"}]},
        "quiet_hours",
    ),  # fullwidth digits
    ({"quiet_hours": [{"start": "22:00", "end": "9" * 4096}]}, "quiet_hours"),
    ({"quiet_hours": [{"start": "22:00"}]}, "quiet_hours"),
    ({"quiet_hours": [{"start": "22:00", "end": "07:00", "days": ["mon"]}]}, "quiet_hours"),
    ({"quiet_hours": [{**NIGHT, "channels": []}]}, "quiet_hours"),
    ({"quiet_hours": [{**NIGHT, "channels": ["fax"]}]}, "quiet_hours"),
    ({"quiet_hours": [{**NIGHT, "channels": ["sms", "sms"]}]}, "quiet_hours"),
    ({"quiet_hours": [{**NIGHT, "channels": "sms"}]}, "quiet_hours"),
    ({"quiet_hours": [NIGHT] * 6}, "quiet_hours"),
    ({"quiet_hours": {"start": "22:00", "end": "07:00"}}, "quiet_hours"),
    ({"quiet_hours": ["22:00-07:00"]}, "quiet_hours"),
    ({"quiet_hours": [{"start": 2200, "end": 700}]}, "quiet_hours"),
    ({"timezone": " Europe/Berlin"}, "timezone"),
]


@pytest.mark.parametrize(("changes", "field"), BAD, ids=[repr(c)[:60] for c, _ in BAD])
def test_a_bad_timezone_or_window_is_a_400_naming_the_field_and_changes_nothing(
    api, changes, field
):
    assert put(api, timezone="Asia/Tokyo", quiet_hours=[NIGHT]).status_code == 201
    response = put(api, **changes)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert field in error["fields"], error
    assert error["message"].startswith(field), error
    got = api.get("/api/v1/users/u-1/preferences").json()
    assert (got["timezone"], got["quiet_hours"]) == ("Asia/Tokyo", [NIGHT])


def test_nan_for_a_time_is_a_400(api):
    body = '{"channels": ["email"], "quiet_hours": [{"start": NaN, "end": "07:00"}]}'
    response = api.generic(
        "PUT", "/api/v1/users/u-1/preferences", body, content_type="application/json"
    )
    assert response.status_code == 400
    assert "quiet_hours" in response.json()["error"]["fields"]


def test_a_window_that_starts_where_it_ends_names_its_end(api):
    response = put(api, quiet_hours=[NIGHT, {"start": "12:00", "end": "12:00"}])
    assert response.json()["error"]["fields"] == {
        "quiet_hours": {"1": {"end": ["Must differ from start."]}}
    }


def test_five_windows_each_of_every_channel_are_accepted(api):
    windows = [
        {"start": f"0{n}:00", "end": f"0{n}:30", "channels": ["email", "sms", "push", "in_app"]}
        for n in range(5)
    ]
    response = put(api, timezone="Australia/Lord_Howe", quiet_hours=windows)
    assert response.status_code == 201, response.json()
    assert response.json()["quiet_hours"] == windows
