"""The named-SQL loader every repository uses."""

import pytest

from notifyqueue.sqlfile import queries_load


def test_named_queries_are_split_at_their_headers(tmp_path):
    path = tmp_path / "q.sql"
    path.write_text("-- preamble\n-- name: one\n-- why\nSELECT 1;\n\n-- name: two\nSELECT 2\n")
    assert queries_load(path) == {"one": "-- why\nSELECT 1", "two": "SELECT 2"}


def test_a_name_defined_twice_is_an_error(tmp_path):
    path = tmp_path / "q.sql"
    path.write_text("-- name: q\nSELECT 1;\n-- name: q\nSELECT 2;\n")
    with pytest.raises(ValueError, match="defined twice"):
        queries_load(path)
