"""Runs an app's named SQL queries and returns their rows as dataclasses, built by column name.

The one way a repository runs its `.sql` file. In an app's `repositories.py`:

    SQL = Queries(Path(__file__).with_name("sql") / "things.sql")

    @dataclass(frozen=True)
    class ThingRecord:
        id: uuid.UUID
        name: str
        settings: dict[str, Any]

    SQL.rows("things_list", row=ThingRecord, client_id=client_id)  # list[ThingRecord]
    SQL.row("thing_read", row=ThingRecord, id=thing_id)  # ThingRecord | None
    SQL.scalar("things_count", client_id=client_id)  # the single column, or None
    SQL.scalars("things_purge", before=moment)  # list of the single column
    SQL.execute("thing_touch", id=thing_id)  # rows changed
    SQL["things_list"]  # the query's text (tests run EXPLAIN on it)

What it guarantees, so that repositories need not:
- Rows are built by name: each column fills the dataclass field of the same name, so a query
  names its columns as the fields (`expr AS field_name` where needed) and reordering a SELECT
  cannot move a value into the wrong field. A column the dataclass has no field for, a required
  field no column fills, or a column named twice raises `QueryShapeError` naming them, before
  any row is built. (When the columns are the fields in their declared order, the checked
  result is built positionally, which is cheaper and fills the same fields.) `row` allows at
  most one row; `scalar` and `scalars` exactly one column.
- Parameters (`%(name)s` in the SQL) are always bound by psycopg, never formatted in; `row` and
  `using` are the gateway's own keywords, so a query that uses either as a parameter name is
  refused when the file is loaded. A list bound to a parameter the SQL casts to an array
  (`%(ids)s::uuid[]`) travels as the text of an array literal, written here for elements that
  are text, UUIDs, integers, floats, booleans or None (psycopg's own array dumper cost about a
  microsecond per element, most of a worker's time in Python); a list
  holding anything else is left to psycopg.
- Types come back decoded, the same way for every query: jsonb as Python values (Django loads
  jsonb as text on its connection, for JSONField to decode; the gateway decodes it on its own
  cursor), json and uuid by psycopg's loaders (`uuid.UUID`), timestamptz as aware datetimes in
  UTC (Django's loader, with USE_TZ on). Bind jsonb parameters as JSON text with `::jsonb`, or
  as `psycopg.types.json.Jsonb(value)`.
- Each call runs on the calling thread's Django connection (`django.db.connection`, or the one
  passed as `using=`), inside whatever transaction the caller opened (`transaction.atomic()`) or
  in autocommit outside one; the gateway never begins or commits a transaction. Statements go
  through Django's cursor, so query logging (`connection.queries`, execute wrappers) and
  django-prometheus' query counters see them. Database errors are Django's `DatabaseError`
  subclasses, for the repository to turn into its domain exceptions.

Moving a repository onto it: replace `queries_load(path)` by `Queries(path)` (it is also a
mapping of name to text, so `SQL[name]` keeps working meanwhile), give each SELECT or RETURNING
the column names of the dataclass it fills, and replace the module's cursor helpers and
`Record(*row)` by the calls above. A statement that returns a record plus a flag (an upsert's
`(xmax = 0) AS created`) fills a private dataclass that has both (see templates/repositories.py).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from django.db import connection
from django.db.backends.base.base import BaseDatabaseWrapper
from psycopg.postgres import types
from psycopg.rows import class_row, scalar_row
from psycopg.types.json import JsonbLoader

from notifyqueue.sqlfile import queries_load

T = TypeVar("T")

# The gateway's own keyword arguments; no query may name a parameter so.
_RESERVED = frozenset({"row", "using"})
_PLACEHOLDER = re.compile(r"%\((\w+)\)s")
# A parameter the statement casts to an array type: `%(name)s::uuid[]`, `%(name)s::text[]`.
_ARRAY_PARAMETER = re.compile(r"%\((\w+)\)s::[\w ]+\[\]")
_JSONB_OID = types["jsonb"].oid


class QueryShapeError(Exception):
    """A query's result does not fit what its caller asked for (a programming error)."""


class Queries(Mapping[str, str]):
    """The named queries of one `.sql` file (see `notifyqueue.sqlfile`), loaded once, and the
    methods that run them. As a mapping it gives each query's text by name."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._texts = queries_load(path)
        # (query name, row class) pairs whose result columns fit, and the row factory that
        # builds their rows; see _cursor.
        self._row_factories: dict[tuple[str, type], Any] = {}
        # Per query, the parameters it casts to an array type.
        self._array_parameters = {
            name: frozenset(_ARRAY_PARAMETER.findall(text)) for name, text in self._texts.items()
        }
        for name, text in self._texts.items():
            reserved = sorted(_RESERVED & set(_PLACEHOLDER.findall(text)))
            if reserved:
                raise ValueError(
                    f"{path}: query {name!r} uses the gateway's keyword(s) {reserved} as "
                    "parameter names; rename them"
                )

    def __getitem__(self, name: str) -> str:
        try:
            return self._texts[name]
        except KeyError:
            raise KeyError(f"{self.path.name} has no query named {name!r}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._texts)

    def __len__(self) -> int:
        return len(self._texts)

    def rows(
        self, name: str, /, *, row: type[T], using: BaseDatabaseWrapper | None = None, **params: Any
    ) -> list[T]:
        """Every row of the query, each a `row` dataclass."""
        with self._cursor(name, row, using, params) as cursor:
            return cursor.fetchall()

    def row(
        self, name: str, /, *, row: type[T], using: BaseDatabaseWrapper | None = None, **params: Any
    ) -> T | None:
        """The query's one row as a `row` dataclass; None when it returned no row."""
        with self._cursor(name, row, using, params) as cursor:
            return self._single(name, cursor.fetchall())

    def scalar(
        self, name: str, /, *, using: BaseDatabaseWrapper | None = None, **params: Any
    ) -> Any:
        """The one column of the query's one row; None when it returned no row (or NULL)."""
        with self._cursor(name, _OneColumn, using, params) as cursor:
            return self._single(name, cursor.fetchall())

    def scalars(
        self, name: str, /, *, using: BaseDatabaseWrapper | None = None, **params: Any
    ) -> list[Any]:
        """The one column of every row the query returned."""
        with self._cursor(name, _OneColumn, using, params) as cursor:
            return cursor.fetchall()

    def execute(
        self, name: str, /, *, using: BaseDatabaseWrapper | None = None, **params: Any
    ) -> int:
        """Runs a statement for its effect; the number of rows it changed (or returned)."""
        with self._cursor(name, None, using, params) as cursor:
            return cursor.rowcount

    @contextmanager
    def _cursor(
        self,
        name: str,
        shape: type | None,
        using: BaseDatabaseWrapper | None,
        params: dict[str, Any],
    ) -> Iterator[Any]:
        text = self[name]
        for key in self._array_parameters[name].intersection(params):
            if type(value := params[key]) is list:
                literal = _array_literal(value)
                if literal is not None:
                    params[key] = literal
        with (using if using is not None else connection).cursor() as cursor:
            # Through Django's cursor wrapper: query logging, execute wrappers and
            # django-prometheus' cursor class all see the statement.
            cursor.execute(text, params)
            # The loader and the row factory are set on psycopg's cursor inside Django's
            # (`.cursor`), after the result arrived: on that one cursor only, so the ORM, whose
            # JSONField expects jsonb as text, is unaffected, and the jsonb loader (which
            # rebuilds the result's transformer) only when the result has a jsonb column.
            raw = cursor.cursor
            result = raw.pgresult
            if result and any(result.ftype(i) == _JSONB_OID for i in range(result.nfields)):
                raw.adapters.register_loader(_JSONB_OID, JsonbLoader)
            if shape is not None:
                factory = self._row_factories.get((name, shape))
                if factory is None and raw.description is not None:
                    # A query's columns are fixed by its text: checked on its first result.
                    columns = [c.name for c in raw.description]
                    self._shape_check(name, shape, columns)
                    factory = _row_factory(shape, columns)
                    self._row_factories[(name, shape)] = factory
                raw.row_factory = factory or class_row(shape)
            yield cursor

    def _shape_check(self, name: str, shape: type, columns: list[str]) -> None:
        where = f"query {name!r} ({self.path.name})"
        if shape is _OneColumn:
            if len(columns) != 1:
                raise QueryShapeError(f"{where} returned columns {columns}, expected one")
            return
        fields, required = _fields(shape)
        problems = []
        if twice := sorted({c for c in columns if columns.count(c) > 1}):
            problems.append(f"column(s) named twice: {twice}")
        if unknown := [c for c in columns if c not in fields]:
            problems.append(f"column(s) {unknown} that {shape.__name__} has no field for")
        if unfilled := sorted(required.difference(columns)):
            problems.append(f"no column for {shape.__name__}'s field(s) {unfilled}")
        if problems:
            raise QueryShapeError(f"{where} returned {'; '.join(problems)}")

    def _single(self, name: str, found: list[T]) -> T | None:
        if len(found) > 1:
            raise QueryShapeError(
                f"query {name!r} ({self.path.name}) returned {len(found)} rows, expected one"
            )
        return found[0] if found else None


def _row_factory(shape: type, columns: list[str]) -> Any:
    """The row factory for a result whose columns passed `_shape_check`: by position when they
    are the dataclass' fields in order (the same fields, without a dict per row), else by
    name."""
    if shape is _OneColumn:
        return scalar_row
    positional = [f.name for f in dataclasses.fields(shape) if f.init and not f.kw_only]
    if columns != positional[: len(columns)]:
        return class_row(shape)

    def by_position(cursor: Any) -> Any:
        return lambda values: shape(*values)

    return by_position


def _array_literal(values: list[Any]) -> str | None:
    """The text of a one-dimensional PostgreSQL array literal holding `values`, or None when an
    element is of a type this does not write (psycopg then dumps the list itself). Text is
    always double-quoted, with backslash and double quote escaped, so any content (commas,
    braces, blanks, the word NULL) stays one element; None is NULL.

    The lists a worker sends are mostly all text, all NULL or all UUIDs: those are joined in one
    call each, which halved the literals' cost in a drain (6.8 → 3.5 µs a delivered row)."""
    if not values:
        return "{}"
    try:
        body = '","'.join(values)
    except TypeError:
        pass  # not all text
    else:
        # The separators hold two double quotes each: any other one, or any backslash, is in
        # an element and must be escaped.
        if "\\" not in body and body.count('"') == 2 * (len(values) - 1):
            return '{"' + body + '"}'
        return _array_literal_each(values)
    first = values[0]
    if first is None and values.count(None) == len(values):
        return "{" + ",".join(["NULL"] * len(values)) + "}"
    if type(first) is uuid.UUID and all(type(value) is uuid.UUID for value in values):
        return "{" + ",".join([value.hex for value in values]) + "}"
    return _array_literal_each(values)


def _array_literal_each(values: list[Any]) -> str | None:
    """`_array_literal`, element by element: any mix of the types it writes."""
    parts = []
    for value in values:
        kind = type(value)
        if kind is not str and isinstance(value, str):
            value, kind = str.__str__(value), str  # a str subclass (TextChoices): its text
        if kind is str:
            if '"' in value or "\\" in value:
                value = value.replace("\\", "\\\\").replace('"', '\\"')
            parts.append(f'"{value}"')
        elif value is None:
            parts.append("NULL")
        elif kind is uuid.UUID:
            parts.append(value.hex)  # 32 hex digits: PostgreSQL's uuid input takes them
        elif kind is int:
            parts.append(str(value))
        elif kind is bool:
            parts.append("t" if value else "f")
        elif kind is float:
            parts.append(repr(value))
        else:
            return None
    return "{" + ",".join(parts) + "}"


class _OneColumn:
    """The shape of `scalar` and `scalars`: exactly one column, of any name."""


@functools.cache
def _fields(cls: type) -> tuple[frozenset[str], frozenset[str]]:
    """The dataclass's init fields, and those of them that have no default."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"row= takes a dataclass, not {cls!r}")
    init = [f for f in dataclasses.fields(cls) if f.init]
    required = [
        f
        for f in init
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    return frozenset(f.name for f in init), frozenset(f.name for f in required)
