"""`python -m notifyqueue.embedded_db`: what it accepts, and what the benchmark changes."""

from notifyqueue import embedded_db


def test_start_refuses_an_argument_it_does_not_know_before_starting_anything(capsys):
    assert embedded_db.main(["embedded_db", "start", "--benchmarks"]) == 2
    assert "start --benchmark" in capsys.readouterr().err


def test_the_benchmark_changes_only_the_spacing_of_checkpoints():
    """The benchmark runs the server the tests run, with PostgreSQL's default checkpoint
    spacing instead of the test suite's small WAL."""
    changed = {
        name
        for name, value in embedded_db.BENCHMARK_SERVER_SETTINGS.items()
        if embedded_db.EMBEDDED_SERVER_SETTINGS.get(name) != value
    }
    assert changed == {"max_wal_size", "min_wal_size", "checkpoint_timeout"}
    assert set(embedded_db.BENCHMARK_SERVER_SETTINGS) == set(embedded_db.EMBEDDED_SERVER_SETTINGS)
