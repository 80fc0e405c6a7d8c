"""Where a drain's CPU goes, per delivered row: the worker's, PostgreSQL's, each statement's.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5499/postgres \\
        bench/.venv/bin/python bench/drain_profile.py --rows 20000 [--workers 1] [--history 1000000]
            [--worker-batch 250]

Creates the benchmark's databases afresh on that server (as `python3 dev.py bench` does), fills
`--history` SENT rows and `--rows` due rows for one client, then runs `--workers` `run_worker
--until-empty` processes (simulated provider) and prints, per delivered row:

- CPU of the worker processes (their rusage) and of every `postgres` process of the server,
  including backends that exited (the postmaster's children times): run it on a server no one
  else is using;
- time in each PL/pgSQL function (`track_functions`) and, when the server loads
  `pg_stat_statements` (`shared_preload_libraries`, with `pg_stat_statements.track = all` to see
  the statements inside functions and triggers), execution and planning time of each statement;
- inserts, updates, HOT updates and deletes of each table.

A server for it, from Debian's PostgreSQL packages:

    initdb -D /tmp/pg/data -U postgres --auth trust
    pg_ctl -D /tmp/pg/data -l /tmp/pg/log start -o "-p 5499 -k /tmp/pg \\
        -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all \\
        -c pg_stat_statements.track_planning=on"
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench.harness as harness


def postgres_cpu_s() -> float:
    """CPU seconds of every postgres server process, with its exited children's."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().split(b"\0")
            if not command[0].endswith(b"postgres") or b"-D" not in command:
                continue  # only postmasters: their children's times include the backends'
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15]) / tick
        except OSError:
            continue
    return total


def py_spy_record(pid: int, output: Path) -> subprocess.Popen:
    """py-spy sampling a worker until it exits: the thread holding the GIL in each sample, so
    shares are of the Python CPU time."""
    output.parent.mkdir(parents=True, exist_ok=True)
    py_spy = Path(sys.executable).with_name("py-spy")
    return subprocess.Popen(
        f"{py_spy} record -p {pid} -r 250 -f raw -o {output} --nonblocking --gil".split(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--history", type=int, default=0)
    parser.add_argument("--worker-batch", type=int, default=250, help="run_worker --batch-size")
    parser.add_argument(
        "--deleted",
        type=int,
        default=0,
        help="PENDING rows created, then deleted (and the tables vacuumed) before the drain: "
        "the queue's high-water mark, as after a backlog was cancelled or purged",
    )
    parser.add_argument(
        "--py-spy",
        metavar="DIR",
        type=Path,
        help="record each worker with py-spy (raw format, DIR/worker-N.raw; summarise them "
        "with bench/profile_summary.py)",
    )
    args = parser.parse_args()
    config = harness.config_parse(["--quick", "--worker-batch", str(args.worker_batch)])
    server = harness.server_find(config)
    database = harness.DATABASES["ours"]
    harness.databases_create(server)
    harness.manage(config, server, "migrate", "--no-input", "--verbosity", "0")
    harness.manage(config, server, "create_client", "bench")
    with server.connect(database) as conn:
        (client_id,) = conn.execute("SELECT id FROM clients_client WHERE name = 'bench'").fetchone()
        conn.execute(f"ALTER DATABASE {database} SET track_functions = 'all'")
    rows = harness.Rows(server, str(client_id))
    if args.deleted:
        rows.create("deleted", args.deleted)
        rows.delete_except(())
    if args.history:
        rows.finished_create("history", args.history)
    rows.create("drain", args.rows)
    with server.connect(database) as conn:
        harness.vacuum_analyze(conn)
        conn.execute("SELECT pg_stat_reset()")
        statements = conn.execute(
            "SELECT count(*) > 0 FROM pg_available_extensions WHERE name = 'pg_stat_statements'"
        ).fetchone()[0]
        if statements:
            try:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                conn.execute("SELECT pg_stat_statements_reset()")
            except psycopg.Error as exc:  # the server does not load it
                print(f"no statement times: {exc}".splitlines()[0])
                statements = False

    postgres_before, started, times_before = postgres_cpu_s(), time.monotonic(), os.times()
    workers = harness.workers_start(config, server, args.workers, until_empty=True)
    recorders = []
    if args.py_spy:
        for n, process in enumerate(workers):
            recorders.append(py_spy_record(process.pid, args.py_spy / f"worker-{n}.raw"))
    for process in workers:
        process.wait()
    for recorder in recorders:
        recorder.wait()
    seconds = time.monotonic() - started
    times_after, postgres_after = os.times(), postgres_cpu_s()
    worker_s = (times_after.children_user + times_after.children_system) - (
        times_before.children_user + times_before.children_system
    )
    per_row = 1e6 / args.rows
    print(
        f"{args.rows:,} rows, {args.workers} worker(s), {args.history:,} finished rows: "
        f"{seconds:.2f} s, {args.rows / seconds:,.0f}/s (process start-up included)"
    )
    print(
        f"CPU per row: worker {worker_s * per_row:.0f} us, "
        f"postgres {(postgres_after - postgres_before) * per_row:.0f} us"
    )
    with server.connect(database) as conn:
        for name, calls, total_ms in conn.execute(
            "SELECT funcname, calls, total_time FROM pg_stat_user_functions "
            "WHERE calls > 0 ORDER BY total_time DESC LIMIT 8"
        ).fetchall():
            print(f"  function {name}: {calls} calls, {total_ms * 1000 / args.rows:.1f} us/row")
        for table, inserted, updated, hot, deleted in conn.execute(
            "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del "
            "FROM pg_stat_user_tables WHERE n_tup_ins + n_tup_upd + n_tup_del > 0 ORDER BY relname"
        ).fetchall():
            print(f"  {table}: {inserted} in, {updated} updated ({hot} HOT), {deleted} deleted")
        if statements:
            for calls, execution, planning, text in conn.execute(
                "SELECT calls, total_exec_time, total_plan_time,"
                " left(regexp_replace(query, '\\s+', ' ', 'g'), 90)"
                " FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database"
                " WHERE datname = current_database())"
                " ORDER BY total_exec_time + total_plan_time DESC LIMIT 14"
            ).fetchall():
                print(
                    f"  {calls:6d} calls, execution {execution * per_row / 1000:5.1f} us/row, "
                    f"planning {planning * per_row / 1000:4.1f} us/row: {text}"
                )


if __name__ == "__main__":
    main()
