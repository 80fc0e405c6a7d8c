"""The SQL gateway every repository runs its named queries through, on real PostgreSQL."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from django.db import DataError, connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from prometheus_client import REGISTRY

from notifications.models import Status
from notifyqueue.sqlgateway import Queries, QueryShapeError

SQL = """
-- name: thing_create
INSERT INTO gw_thing (id, name, settings, tags, created_at)
VALUES (%(id)s, %(name)s, %(settings)s::jsonb, %(tags)s::jsonb, %(created_at)s);

-- name: things_list
-- Columns deliberately in another order than ThingRecord's fields.
SELECT created_at, tags, settings, name, id FROM gw_thing ORDER BY name;

-- name: thing_read
SELECT id, name, settings, tags, created_at FROM gw_thing WHERE id = %(id)s;

-- name: thing_read_by_name
SELECT id, name, settings, tags, created_at FROM gw_thing WHERE name = %(name)s;

-- name: thing_read_with_extra
SELECT id, name, settings, tags, created_at, length(name) AS name_length FROM gw_thing;

-- name: thing_read_without_name
SELECT id, settings, tags, created_at FROM gw_thing;

-- name: thing_read_name_twice
SELECT id, name, settings, tags, created_at, upper(name) AS name FROM gw_thing;

-- name: thing_label
SELECT name, upper(name) AS label FROM gw_thing ORDER BY name;

-- name: things_count
SELECT count(*) FROM gw_thing;

-- name: thing_name
SELECT name FROM gw_thing WHERE id = %(id)s;

-- name: thing_names
SELECT name FROM gw_thing ORDER BY name;

-- name: arrays_echo
SELECT %(texts)s::text[] AS texts, %(ids)s::uuid[] AS ids, %(numbers)s::bigint[] AS numbers,
       %(fractions)s::float8[] AS fractions, %(flags)s::boolean[] AS flags,
       %(moments)s::timestamptz[] AS moments;

-- name: arrays_unnest
SELECT t.value, t.n FROM unnest(%(texts)s::text[]) WITH ORDINALITY AS t(value, n);

-- name: things_rename
UPDATE gw_thing SET name = name || %(suffix)s WHERE name LIKE %(prefix)s || '%%';
"""


@dataclass(frozen=True)
class ThingRecord:
    id: uuid.UUID
    name: str
    settings: dict[str, Any]
    tags: list[str]
    created_at: dt.datetime


@dataclass(frozen=True)
class LabelledName:
    name: str
    label: str
    note: str = ""


@dataclass(frozen=True)
class Arrays:
    texts: list[str | None]
    ids: list[uuid.UUID]
    numbers: list[int]
    fractions: list[float]
    flags: list[bool]
    moments: list[dt.datetime]


@dataclass(frozen=True)
class Element:
    value: str | None
    n: int


NOW = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)

# Text that an array literal written carelessly would split, merge, unquote or turn into NULL.
HOSTILE_TEXTS = [
    "plain",
    "",
    " padded ",
    "a,b",
    "{braces}",
    "}{",
    '"quoted"',
    "back\\slash\\",
    "\\",
    '\\"',
    "NULL",
    "null",
    None,
    "new\nline\ttab",
    "ünïcødé ✉ 😀",
    "'single' ''quotes''",
    "x" * 5000,
]


@pytest.fixture
def queries(tmp_path, db) -> Queries:
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TEMP TABLE gw_thing (id uuid PRIMARY KEY, name text NOT NULL,"
            " settings jsonb NOT NULL, tags jsonb NOT NULL, created_at timestamptz NOT NULL)"
        )
    path = tmp_path / "things.sql"
    path.write_text(SQL)
    return Queries(path)


def create(queries: Queries, name: str, **settings: Any) -> uuid.UUID:
    thing_id = uuid.uuid4()
    queries.execute(
        "thing_create",
        id=thing_id,
        name=name,
        settings=json.dumps(settings),
        tags='["a", "b"]',
        created_at=NOW,
    )
    return thing_id


def test_rows_fill_dataclass_fields_by_column_name_not_position(queries):
    first = create(queries, "alpha", retries=3)
    second = create(queries, "beta")

    things = queries.rows("things_list", row=ThingRecord)

    assert things == [
        ThingRecord(first, "alpha", {"retries": 3}, ["a", "b"], NOW),
        ThingRecord(second, "beta", {}, ["a", "b"], NOW),
    ]


def test_rows_whose_columns_follow_the_fields_in_order_are_the_same_rows(queries):
    # thing_read lists ThingRecord's fields in order (built by position); things_list does
    # not (built by name): the same rows either way.
    first = create(queries, "alpha", retries=3)

    assert (
        queries.row("thing_read", row=ThingRecord, id=first)
        == queries.rows("things_list", row=ThingRecord)[0]
    )


def test_lists_cast_to_arrays_come_back_element_for_element(queries):
    sent = Arrays(
        texts=HOSTILE_TEXTS,
        ids=[uuid.uuid4(), uuid.UUID(int=0)],
        numbers=[0, -1, 2**62],
        fractions=[0.1, -2.5e-300, 1e300, float("inf")],
        flags=[True, False],
        # Not a type the gateway writes: psycopg dumps this list itself.
        moments=[NOW, NOW + dt.timedelta(days=1)],
    )
    empty = Arrays([], [], [], [], [], [])

    for arrays in (sent, empty):
        assert queries.row("arrays_echo", row=Arrays, **dataclasses.asdict(arrays)) == arrays


def test_a_nul_in_a_list_element_is_refused_before_the_statement_runs(queries):
    # PostgreSQL text cannot hold NUL: refused as psycopg refuses it in any text parameter.
    with pytest.raises(DataError):
        queries.rows("arrays_unnest", row=Element, texts=["fine", "not\x00fine"])


def test_text_choices_in_a_list_go_as_their_text(queries):
    # Enumerations that are str (Django's TextChoices) are written like any text.
    elements = queries.rows("arrays_unnest", row=Element, texts=[Status.SENT, Status.PENDING])

    assert [e.value for e in elements] == ["SENT", "PENDING"]
    assert type(elements[0].value) is str


def test_each_element_of_a_text_array_stays_one_element(queries):
    elements = queries.rows("arrays_unnest", row=Element, texts=HOSTILE_TEXTS)

    assert [e.value for e in elements] == HOSTILE_TEXTS
    assert [e.n for e in elements] == list(range(1, len(HOSTILE_TEXTS) + 1))


@pytest.mark.parametrize(
    "texts",
    [
        [text for text in HOSTILE_TEXTS if text is not None],  # all text: joined at once
        ["plain", "words"],
        [""],
        ["", ""],
        ['a","b', "c"],  # the separator's own text inside an element
        ['"'],
        ["\\"],
        [None, None, None],  # all NULL
        [None, "after a NULL"],
    ],
)
def test_every_shape_of_a_text_list_comes_back_as_sent(queries, texts):
    elements = queries.rows("arrays_unnest", row=Element, texts=texts)

    assert [e.value for e in elements] == texts


def test_jsonb_uuid_and_timestamptz_come_back_decoded(queries):
    thing_id = create(queries, "alpha", nested={"deep": [1, None, "x"]})

    thing = queries.row("thing_read", row=ThingRecord, id=thing_id)

    assert thing.settings == {"nested": {"deep": [1, None, "x"]}}
    assert thing.tags == ["a", "b"]
    assert type(thing.id) is uuid.UUID
    assert thing.created_at == NOW
    assert thing.created_at.utcoffset() == dt.timedelta(0)


def test_a_column_the_dataclass_lacks_is_an_error_naming_it(queries):
    create(queries, "alpha")

    with pytest.raises(QueryShapeError, match=r"\['name_length'\] that ThingRecord has no field"):
        queries.rows("thing_read_with_extra", row=ThingRecord)


def test_a_required_field_no_column_fills_is_an_error_naming_it(queries):
    create(queries, "alpha")

    with pytest.raises(QueryShapeError, match=r"no column for ThingRecord's field\(s\) \['name'\]"):
        queries.rows("thing_read_without_name", row=ThingRecord)


def test_a_column_named_twice_is_an_error(queries):
    create(queries, "alpha")

    with pytest.raises(QueryShapeError, match=r"named twice: \['name'\]"):
        queries.rows("thing_read_name_twice", row=ThingRecord)


def test_a_field_with_a_default_may_have_no_column(queries):
    create(queries, "alpha")

    assert queries.rows("thing_label", row=LabelledName) == [LabelledName("alpha", "ALPHA")]


def test_row_is_none_when_the_query_returns_no_row(queries):
    assert queries.row("thing_read", row=ThingRecord, id=uuid.uuid4()) is None


def test_row_refuses_a_query_that_returns_several_rows(queries):
    create(queries, "same")
    create(queries, "same")

    with pytest.raises(QueryShapeError, match="returned 2 rows, expected one"):
        queries.row("thing_read_by_name", row=ThingRecord, name="same")


def test_scalar_is_the_single_column_of_the_single_row(queries):
    thing_id = create(queries, "alpha")
    create(queries, "beta")

    assert queries.scalar("things_count") == 2
    assert queries.scalar("thing_name", id=thing_id) == "alpha"
    assert queries.scalar("thing_name", id=uuid.uuid4()) is None
    assert queries.scalars("thing_names") == ["alpha", "beta"]


def test_scalar_refuses_a_query_with_several_columns(queries):
    create(queries, "alpha")

    with pytest.raises(QueryShapeError, match=r"columns \['name', 'label'\], expected one"):
        queries.scalars("thing_label")


def test_execute_returns_the_number_of_rows_changed(queries):
    create(queries, "job-1")
    create(queries, "job-2")
    create(queries, "other")

    assert queries.execute("things_rename", prefix="job", suffix="-done") == 2
    assert queries.execute("things_rename", prefix="nothing", suffix="-done") == 0
    assert queries.scalars("thing_names") == ["job-1-done", "job-2-done", "other"]


def test_parameters_are_bound_so_sql_in_a_value_stays_data(queries):
    hostile = "x'; DROP TABLE gw_thing; --"
    thing_id = create(queries, hostile)

    assert queries.scalar("thing_name", id=thing_id) == hostile
    assert queries.row("thing_read_by_name", row=ThingRecord, name=hostile).id == thing_id
    assert queries.scalar("things_count") == 1


def test_statements_go_through_django_query_logging_and_prometheus_counters(queries):
    labels = {"alias": connection.alias, "vendor": connection.vendor}
    before = REGISTRY.get_sample_value("django_db_execute_total", labels)

    with CaptureQueriesContext(connection) as captured:
        queries.scalar("things_count")

    assert [q["sql"] for q in captured.captured_queries] == ["SELECT count(*) FROM gw_thing"]
    assert REGISTRY.get_sample_value("django_db_execute_total", labels) == before + 1


def test_it_runs_inside_the_callers_transaction(queries):
    create(queries, "kept")
    with pytest.raises(RuntimeError), transaction.atomic():
        create(queries, "rolled back")
        assert queries.scalar("things_count") == 2
        raise RuntimeError("abort")

    assert queries.scalars("thing_names") == ["kept"]


def test_using_names_the_connection_to_run_on(queries):
    create(queries, "alpha")

    assert queries.scalar("things_count", using=connections["default"]) == 1


def test_the_connection_keeps_loading_jsonb_as_text_for_the_orm(queries):
    thing_id = create(queries, "alpha", retries=3)
    queries.row("thing_read", row=ThingRecord, id=thing_id)

    with connection.cursor() as cursor:
        cursor.execute("SELECT settings FROM gw_thing")
        assert cursor.fetchone() == ('{"retries": 3}',)


def test_a_query_using_the_gateways_keywords_as_parameters_is_refused(tmp_path):
    path = tmp_path / "bad.sql"
    path.write_text("-- name: bad\nSELECT * FROM t WHERE r = %(row)s AND u = %(using)s;\n")

    with pytest.raises(
        ValueError, match=r"'bad' uses the gateway's keyword\(s\) \['row', 'using'\]"
    ):
        Queries(path)


def test_an_unknown_query_name_is_a_key_error_naming_the_file(queries):
    with pytest.raises(KeyError, match=r"things\.sql has no query named 'nope'"):
        queries.scalar("nope")
    assert set(queries) >= {"thing_create", "things_list"}
    assert queries["things_count"] == "SELECT count(*) FROM gw_thing"
