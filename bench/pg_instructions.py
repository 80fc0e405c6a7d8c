"""PostgreSQL's instructions for the statements of the hot path, counted by callgrind: a figure
the host's speed does not move, for changes too small for the benchmark's noise to show.

    .venv/bin/python bench/pg_instructions.py [--statement create|batch|update|turn]
        [--count N] [--warm N] [--batch-size N] [--history N] [--webhooks] [--top 40]
        [--functions-of NAME] [--keep]

Needs valgrind (`apt-get install valgrind`) and the pgserver wheel's PostgreSQL (the embedded
one). Starts a server of its own in a temporary folder, migrates it, makes a client with an
API key and stops it. Then runs the statement in a single-user server (`postgres --single`,
each statement its own transaction, as the API's are) under callgrind twice on that folder:
`--warm` statements, then `--warm` + `--count`. The difference of the two totals divided by
`--count` is one statement's instructions with its commit and triggers, the start-up and the
first statements' catalog reads taken out; the functions whose inclusive count grew most are
printed under it. The single-user server also prints each answer's rows (`debugtup`), where a
server sends them to its client: a batch's thousand answered rows show there.

Statements:
- `create`: the thin path's single create (`notification_create_checked`, with its API key
  check), written out with its values as the API's parameters give them;
- `batch`: the batch create (`notifications_create_many`) of `--batch-size` items, also
  counted a row;
- `update`: a one-row UPDATE of `notification` that changes nothing (`updated_at =
  updated_at`): what every statement writing the table pays, its triggers included;
- `turn`: the delivery worker's turns. `--history` rows already SENT and `--warm` +
  `--count` claims' worth of rows due (each to its own recipient) are written first; then a
  server under callgrind (a real one: the worker's statements arrive as a client's) serves a
  worker built as `run_worker` builds it, in this process, for that many turns
  (`Worker.run_once`: claim, admission, the simulated provider's store, finish). Callgrind
  writes one file for each statement the worker's backend ran, so each statement of the last
  `--count` turns is counted on its own, by the name it has in its `.sql` file, a row; with
  each turn's least and most, since a plan can change from one turn to the next.
  `NOTIFYQUEUE_SIMULATED_FAILURE_RATE=1` makes every send fail (retries, freed slots);
  `--webhooks` gives the client a webhook URL, so each finish also writes its events.

docs/performance.md says what bounds each benchmark figure in these counts.
"""

from __future__ import annotations

import argparse
import collections
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "notifyqueue.settings")
os.environ.setdefault("DJANGO_SECRET_KEY", "pg-instructions")
os.environ.setdefault("LOG_LEVEL", "ERROR")

from notifyqueue import embedded_db  # noqa: E402  (no Django)

COLLECTED = re.compile(r"Collected : (\d+)")
CALLGRIND_TOTAL = re.compile(r"^(?:summary|totals): (\d+)", re.MULTILINE)
ANNOTATED = re.compile(r"^\s*([\d,]+) \(\s*[\d.]+%\)\s+(?:\?\?\?:)?(\S+)")


def prepared_folder(state_dir: Path, *, history: int = 0) -> tuple[Path, dict[str, str]]:
    """A migrated database in `state_dir` with a client, one notification and `history` rows
    of the client already SENT (written directly, as the benchmark's history is); its data
    folder, and the values the statements need (the client, its API key's prefix and hash, the
    notification's id)."""
    os.environ["DATABASE_URL"] = embedded_db.database_url(state_dir=state_dir)
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    made = io.StringIO()
    call_command("create_client", "pg-instructions", stdout=made)
    values = {"prefix": json.loads(made.getvalue())["api_key"].partition(".")[0]}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT client_id::text, hashed_key FROM clients_clientapikey WHERE prefix = %s",
            [values["prefix"]],
        )
        values["client_id"], values["hashed_key"] = cursor.fetchone()
        cursor.execute(_create(values, "first"))
        values["notification_id"] = str(cursor.fetchone()[0])
        if history:
            from bench.harness import notifications_insert

            notifications_insert(cursor, values["client_id"], "history", history, status="SENT")
    connection.close()
    embedded_db.stop(state_dir)
    return state_dir / "pgdata", values


def _new(values: dict[str, str], key: str, recipient: str = "bench@example.com"):
    """A create of the benchmark's shape (bench/harness.py's bodies) for the client."""
    from notifications.repositories import NewNotification
    from notifyqueue.vocabulary import Priority

    return NewNotification(
        client_id=uuid.UUID(values["client_id"]),
        idempotency_key=key,
        request_fingerprint="f" * 64,
        channel="email",
        recipient=recipient,
        subject="Hi",
        body="Your code is 123456",
        priority=Priority.NORMAL,
        metadata={},
        user_id=None,
        template=None,
        payload=None,
        fallback_channels=[],
        max_attempts=5,
    )


def _written_out(name: str, params: dict) -> str:
    """The named statement of notifications/sql/notifications.sql with `params` as literals."""
    from psycopg import sql

    from notifications.repositories import QUERIES

    def literal(match: re.Match) -> str:
        value = params[match.group(1)]
        if value is None:
            return "NULL"
        # A client id as text, so counts stay comparable with earlier runs of this script
        # (psycopg writes a UUID with a cast).
        return sql.quote(str(value) if isinstance(value, uuid.UUID) else value)

    return re.sub(r"%\((\w+)\)s", literal, QUERIES[name])


def _create(values: dict[str, str], key: str) -> str:
    """The thin path's single create, with the parameters NotificationRepository.insert sends."""
    from notifications.repositories import KeyCheck, create_params

    check = KeyCheck(prefix=values["prefix"], hashed_key=values["hashed_key"])
    return _written_out("notification_create_checked", create_params(_new(values, key), check))


def _batch(values: dict[str, str], key: str, size: int, *, recipients: bool = False) -> str:
    """A batch create of `size` items, with the parameters NotificationRepository.insert_many
    sends; with `recipients`, each to its own address (as the benchmark's drains)."""
    from notifications.repositories import batch_params

    new = [
        _new(values, f"{key}-{n}", *([f"{key}-{n}@example.com"] if recipients else []))
        for n in range(size)
    ]
    return _written_out(
        "notifications_create_many", batch_params(uuid.UUID(values["client_id"]), new)
    )


def statements(kind: str, count: int, values: dict[str, str], batch_size: int) -> str:
    """`count` statements of `kind`, each its own transaction in the single-user server's
    input (a statement ends with a semicolon and an empty line)."""
    if kind == "create":
        texts = [_create(values, f"{uuid.uuid4().hex}-{n}") for n in range(count)]
    elif kind == "batch":
        texts = [_batch(values, f"{uuid.uuid4().hex}-{n}", batch_size) for n in range(count)]
    else:
        update = (
            "UPDATE notification SET updated_at = updated_at "
            f"WHERE id = '{values['notification_id']}'"
        )
        texts = [update] * count
    return "".join(f"{text.rstrip().rstrip(';')};\n\n" for text in texts)


def single_user(pgdata: Path, text: str, out: Path | None) -> int:
    """Runs `text` in a single-user server on `pgdata` (under callgrind when `out` is given);
    returns callgrind's total, or 0."""
    postgres = str(embedded_db._pgserver_commands().POSTGRES_BIN_PATH / "postgres")
    command = [postgres, "--single", "-D", str(pgdata), "-j", embedded_db.DATABASE_NAME]
    if out is not None:
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *command]
    if os.geteuid() == 0:  # pgserver's server runs as its own account when started by root
        command = ["runuser", "-u", "pgserver", "--", *command]
    done = subprocess.run(command, input=text, capture_output=True, text=True)
    if done.returncode or "ERROR:" in done.stderr:
        raise SystemExit(f"the single-user server failed:\n{done.stderr[-2000:]}")
    if out is None:
        return 0
    return int(COLLECTED.findall(done.stderr)[-1])


def turn_rows(values: dict[str, str], turns: int, batch_size: int, *, webhooks: bool) -> str:
    """The single-user server's input that leaves `turns` full claims due: batch creates of
    `batch_size` rows, each row to its own recipient (so the rate limit admits every one),
    then the statistics a worker would have refreshed. With `webhooks`, the client has a
    webhook URL, so each final status also writes its event (the outbox trigger; no sender
    runs)."""
    texts = []
    if webhooks:
        texts.append(
            "UPDATE clients_client SET webhook_url = 'https://hooks.example.com/notify' "
            f"WHERE id = '{values['client_id']}'"
        )
    texts += [_batch(values, f"turn-{n}", batch_size, recipients=True) for n in range(turns)]
    texts.append("VACUUM ANALYZE")
    return "".join(f"{text.rstrip().rstrip(';')};\n\n" for text in texts)


def worker_turns(
    pgdata: Path, warm: int, count: int, batch_size: int, out: Path
) -> list[tuple[str, Path]]:
    """Runs `warm` + `count` of the delivery worker's turns (`Worker.run_once`, configured as
    `run_worker` is, the simulated provider answering) in this process against a server on
    `pgdata` started under callgrind, which writes a file for each statement the backend ran
    (`--dump-after=exec_simple_query`: Django's psycopg connection binds on the client and
    sends each statement as a simple query, which ends with its commit). Returns the last
    `count` turns' statements: each one's name (`Queries` names, or its first words) and its
    callgrind file."""
    from django.db import connection

    from delivery.circuits.repositories import SQL as circuits_sql
    from delivery.circuits.services import circuits_register
    from delivery.management.commands.run_worker import worker_from_settings
    from delivery.repositories import SQL as delivery_sql
    from ratelimits.repositories import SQL as ratelimits_sql

    postgres = str(embedded_db._pgserver_commands().POSTGRES_BIN_PATH / "postgres")
    command = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out}/callgrind.%p",
        "--dump-after=exec_simple_query",
        postgres,
        "-D",
        str(pgdata),
        "-k",
        str(pgdata),
        "-h",
        "",
        # Nothing but the worker's statements (and the server's own processes) runs.
        "-c",
        "autovacuum=off",
    ]
    if os.geteuid() == 0:
        command = ["runuser", "-u", "pgserver", "--", *command]
    with open(out / "server.log", "w") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    # Each statement by its name in the worker's `.sql` files.
    names = {
        queries[name]: name
        for queries in (delivery_sql, ratelimits_sql, circuits_sql)
        for name in queries
    }
    sent: list[str] = []

    def named(execute, sql, params, many, context):
        sent.append(names.get(sql, " ".join(sql.split()[:4])))
        return execute(sql, params, many, context)

    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                connection.ensure_connection()
                break
            except Exception as exc:
                connection.close()
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the server did not start: see {out / 'server.log'}") from exc
                time.sleep(0.5)
        worker = worker_from_settings(concurrency=8, batch_size=batch_size)
        circuits_register(list(worker.circuits.values()))
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            backend = cursor.fetchone()[0]
        counted_from = 0
        with connection.execute_wrapper(named):
            for turn in range(warm + count):
                if turn == warm:
                    counted_from = len(sent)
                step = worker.run_once()
                if not step.claimed == step.finished == batch_size:
                    raise SystemExit(f"a turn claimed {step.claimed} and finished {step.finished}")
        connection.close()
    finally:
        postmaster = int((pgdata / "postmaster.pid").read_text().split()[0])
        os.kill(postmaster, signal.SIGINT)  # a fast shutdown: each process writes its last file
        server.wait(timeout=600)
    # The backend's parts, numbered from 1: one a statement, the last ones the turns'.
    # (`callgrind.<pid>` without a number is what ran after the last: the connection's end.)
    parts = sorted(
        out.glob(f"callgrind.{backend}.*"), key=lambda path: int(path.name.rpartition(".")[2])
    )
    if len(parts) < len(sent):
        raise SystemExit(f"{len(parts)} callgrind parts for {len(sent)} statements")
    return list(zip(sent, parts[-len(sent) :], strict=True))[counted_from:]


def part_instructions(path: Path) -> int:
    """A callgrind file's instructions."""
    return int(CALLGRIND_TOTAL.findall(path.read_text())[-1])


def inclusive(out: Path) -> collections.Counter[str]:
    """Each function's inclusive instructions in a callgrind file (recursive calls once)."""
    annotated = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(out)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    counts: collections.Counter[str] = collections.Counter()
    for line in annotated.splitlines():
        found = ANNOTATED.match(line)
        if found and "'" not in found.group(2):
            counts[found.group(2)] += int(found.group(1).replace(",", ""))
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--statement", choices=("create", "batch", "update", "turn"), default="create"
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        help="items a batch statement (1,000); rows a worker's claim (run_worker's default)",
    )
    parser.add_argument(
        "--count", type=int, help="statements counted (500; a batch statement: 5; turns: 16)"
    )
    parser.add_argument(
        "--warm", type=int, help="statements before them (100; a batch statement: 2; turns: 2)"
    )
    parser.add_argument("--top", type=int, default=40, help="functions listed (40)")
    parser.add_argument(
        "--history", type=int, default=100_000, help="turns: rows already SENT (100,000)"
    )
    parser.add_argument(
        "--webhooks",
        action="store_true",
        help="turns: the client has a webhook URL (each final status writes its event)",
    )
    parser.add_argument(
        "--functions-of",
        metavar="NAME",
        help="turns: list the functions of this statement only (its name as printed)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the callgrind files (their folder is printed)"
    )
    args = parser.parse_args()
    few = args.statement in ("batch", "turn")
    args.count = args.count or (16 if args.statement == "turn" else 5 if few else 500)
    args.warm = args.warm or (2 if few else 100)
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed: apt-get install valgrind")

    state_dir = Path(tempfile.mkdtemp(prefix="pg-instructions-"))
    state_dir.chmod(0o755)  # the server's own account works in it
    try:
        # Without a history the tables are so small that the planner reads them whole (a
        # claim hashed the whole notification table).
        history = args.history if args.statement == "turn" else 0
        pgdata, values = prepared_folder(state_dir, history=history)
        if args.batch_size is None:
            from delivery.worker import WorkerConfig

            args.batch_size = WorkerConfig.batch_size if args.statement == "turn" else 1000
        # Catalog caches and kept plans are the connection's: warmed within each run by its
        # first `--warm` statements. This run fills the table's first pages.
        single_user(pgdata, statements("create", args.warm, values, args.batch_size), None)
        profiles = state_dir / "callgrind"
        profiles.mkdir(mode=0o777)
        profiles.chmod(0o777)  # written by the server's account
        if args.statement == "turn":
            made = turn_rows(
                values, args.warm + args.count, args.batch_size, webhooks=args.webhooks
            )
            single_user(pgdata, made, None)
            counted = worker_turns(pgdata, args.warm, args.count, args.batch_size, profiles)
            rows = args.count * args.batch_size
            by_statement: dict[str, list[int]] = collections.defaultdict(list)
            grown: collections.Counter[str] = collections.Counter()
            for name, part in counted:
                by_statement[name].append(part_instructions(part))
                if args.functions_of in (None, name):
                    grown.update(inclusive(part))
            each = sum(map(sum, by_statement.values())) / rows
            print(
                f"worker's turns of {args.batch_size} rows: {each:,.0f} instructions a row "
                "in the worker's backend; by statement, a row (each turn's least and most):"
            )
            for name, turns in sorted(by_statement.items(), key=lambda item: -sum(item[1])):
                print(
                    f"{sum(turns) / rows:12,.0f}  {name} ({min(turns) / args.batch_size:,.0f}-"
                    f"{max(turns) / args.batch_size:,.0f}, {len(turns)} turns)"
                )
            print(f"by function, a row: {args.functions_of or 'every statement'}")
            scale = rows
            if args.functions_of:
                each = sum(by_statement[args.functions_of]) / rows
        else:
            runs = []
            for count in (args.warm, args.warm + args.count):
                out = profiles / f"callgrind.{count}"
                total = single_user(
                    pgdata, statements(args.statement, count, values, args.batch_size), out
                )
                runs.append((total, inclusive(out)))
            (before, by_function_before), (after, grown) = runs
            grown.subtract(by_function_before)
            each = (after - before) / args.count
            per_row = f", {each / args.batch_size:,.0f} a row" if few else ""
            print(f"{args.statement}: {each:,.0f} instructions a statement{per_row}")
            scale = args.count
        # Below the functions every instruction runs under (main and its callers).
        inside = [(name, n / scale) for name, n in grown.most_common() if n / scale < 0.999 * each]
        for name, instructions in inside[: args.top]:
            print(f"{instructions:12,.0f}  {name}")
    finally:
        embedded_db.stop(state_dir)
        if args.keep:
            print(f"callgrind files: {state_dir / 'callgrind'}")
        else:
            shutil.rmtree(state_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
