"""The peers' side of the benchmark: procrastinate and pgqueuer on the same PostgreSQL.

Runs inside the benchmark's own environment (bench/.venv), never the project's. Each command
prints one JSON object on its last line. The harness (bench/harness.py) calls:

    peers.py install       --system S --dsn URL
    peers.py ingest-single --system S --dsn URL --seconds 10 --connections 8
    peers.py ingest-batch  --system S --dsn URL --seconds 10 --connections 4 --batch 1000
    peers.py worker        --system S --dsn URL --concurrency 16   (drains, then exits)
    peers.py latency       --system S --dsn URL --rate 200 --seconds 10 --warmup 1
    peers.py pending       --system S --dsn URL

The job is a no-op: what is measured is each queue's own cost, as the project's simulated
provider measures the project's own bookkeeping.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from datetime import timedelta

import asyncpg
import procrastinate
from pgqueuer import Queries, QueueManager
from pgqueuer.db import AsyncpgDriver, AsyncpgPoolDriver
from pgqueuer.types import QueueExecutionMode

TASK = "noop"

# (enqueued at, started - enqueued), both from time.time(), for each job that carried its time.
LATENCIES: list[tuple[float, float]] = []
procrastinate_app: procrastinate.App
procrastinate_noop: procrastinate.tasks.Task


async def procrastinate_task(sent: float = 0.0) -> None:
    if sent:
        LATENCIES.append((sent, time.time() - sent))


async def procrastinate_open(dsn: str, *, pool_size: int = 10) -> None:
    global procrastinate_app, procrastinate_noop
    connector = procrastinate.PsycopgConnector(conninfo=dsn, min_size=1, max_size=pool_size)
    procrastinate_app = procrastinate.App(connector=connector)
    procrastinate_noop = procrastinate_app.task(name=TASK)(procrastinate_task)
    await procrastinate_app.open_async()


async def pgqueuer_pool(dsn: str, size: int) -> asyncpg.Pool:
    return await asyncpg.create_pool(dsn, min_size=size, max_size=size)


async def install(args) -> dict:
    if args.system == "procrastinate":
        await procrastinate_open(args.dsn, pool_size=1)
        await procrastinate_app.schema_manager.apply_schema_async()
        await procrastinate_app.close_async()
    else:
        connection = await asyncpg.connect(args.dsn)
        await Queries(AsyncpgDriver(connection)).install()
        await connection.close()
    return {"installed": args.system}


async def timed_loop(seconds: float, connections: int, one) -> int:
    """Runs `one(worker)` back to back on `connections` tasks for `seconds`; returns items."""
    deadline = time.perf_counter() + seconds
    done = [0] * connections

    async def loop(worker: int) -> None:
        while time.perf_counter() < deadline:
            done[worker] += await one(worker)

    await asyncio.gather(*(loop(n) for n in range(connections)))
    return sum(done)


async def ingest(args, *, batch: int) -> dict:
    if args.system == "procrastinate":
        await procrastinate_open(args.dsn, pool_size=args.connections)

        async def one(worker: int) -> int:
            if batch == 1:
                await procrastinate_noop.defer_async()
            else:
                await procrastinate_noop.batch_defer_async(*({} for _ in range(batch)))
            return batch

        started = time.perf_counter()
        count = await timed_loop(args.seconds, args.connections, one)
        elapsed = time.perf_counter() - started
        await procrastinate_app.close_async()
    else:
        pool = await pgqueuer_pool(args.dsn, args.connections)
        queries = Queries(AsyncpgPoolDriver(pool))

        async def one(worker: int) -> int:
            if batch == 1:
                await queries.enqueue(TASK, None)
            else:
                await queries.enqueue([TASK] * batch, [None] * batch, [0] * batch)
            return batch

        started = time.perf_counter()
        count = await timed_loop(args.seconds, args.connections, one)
        elapsed = time.perf_counter() - started
        await pool.close()
    return {"count": count, "seconds": elapsed, "rate": count / elapsed}


async def pending(args) -> dict:
    connection = await asyncpg.connect(args.dsn)
    if args.system == "procrastinate":
        sql = "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"
    else:
        sql = "SELECT count(*) FROM pgqueuer"
    count = await connection.fetchval(sql)
    await connection.close()
    return {"pending": count}


async def worker(args) -> dict:
    """Drains the queue with one worker of `concurrency`, then exits (with --wait: until the
    process is told to stop)."""
    if args.system == "procrastinate":
        await procrastinate_open(args.dsn, pool_size=min(args.concurrency, 10) + 2)
        await procrastinate_app.run_worker_async(
            concurrency=args.concurrency,
            wait=args.wait,
            install_signal_handlers=True,
            listen_notify=True,
            delete_jobs="always",
        )
        await procrastinate_app.close_async()
    else:
        connection = await asyncpg.connect(args.dsn)
        manager = QueueManager(Queries(AsyncpgDriver(connection)))

        @manager.entrypoint(TASK)
        async def pgqueuer_noop(job) -> None:
            if job.payload:
                sent = float(job.payload.decode())
                LATENCIES.append((sent, time.time() - sent))

        await manager.run(
            batch_size=args.batch_size,
            mode=QueueExecutionMode.continuous if args.wait else QueueExecutionMode.drain,
            dequeue_timeout=timedelta(seconds=1),
        )
        await connection.close()
    return {"latencies": [wait for _, wait in LATENCIES]}


async def latency(args) -> dict:
    """Enqueues at a steady `rate` for `warmup` then `seconds` while this process also runs
    one worker; each job carries its enqueue time, so start - enqueue is measured on one
    clock. Jobs enqueued in the warm-up are run, not counted."""
    interval = 1.0 / args.rate
    total = int(args.rate * (args.warmup + args.seconds))
    if args.system == "procrastinate":
        await procrastinate_open(args.dsn, pool_size=6)

        async def enqueue() -> None:
            await procrastinate_noop.defer_async(sent=time.time())

        run = procrastinate_app.run_worker_async(
            concurrency=4, wait=True, install_signal_handlers=False, delete_jobs="always"
        )
    else:
        pool = await pgqueuer_pool(args.dsn, 4)
        queries = Queries(AsyncpgPoolDriver(pool))
        connection = await asyncpg.connect(args.dsn)
        manager = QueueManager(Queries(AsyncpgDriver(connection)))

        @manager.entrypoint(TASK)
        async def pgqueuer_noop(job) -> None:
            sent = float(job.payload.decode())
            LATENCIES.append((sent, time.time() - sent))

        async def enqueue() -> None:
            await queries.enqueue(TASK, str(time.time()).encode())

        run = manager.run(batch_size=10, dequeue_timeout=timedelta(seconds=1))
    running = asyncio.ensure_future(run)
    await asyncio.sleep(1.0)
    start = time.perf_counter()
    counted_from = time.time() + args.warmup
    pending_sends = []
    for n in range(total):
        delay = start + n * interval - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        pending_sends.append(asyncio.ensure_future(enqueue()))
    await asyncio.gather(*pending_sends)
    deadline = time.perf_counter() + 30
    while len(LATENCIES) < total and time.perf_counter() < deadline:
        await asyncio.sleep(0.05)
    if args.system == "procrastinate":
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await procrastinate_app.close_async()
    else:
        manager.shutdown.set()
        await asyncio.gather(running, return_exceptions=True)
        await pool.close()
        await connection.close()
    values = sorted(wait for sent, wait in LATENCIES if sent >= counted_from)
    return {
        "count": len(values),
        "p50_ms": 1000 * percentile(values, 50),
        "p95_ms": 1000 * percentile(values, 95),
        "p99_ms": 1000 * percentile(values, 99),
        "mean_ms": 1000 * statistics.fmean(values) if values else None,
    }


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    index = min(len(values) - 1, max(0, round(p / 100 * len(values) + 0.5) - 1))
    return values[index]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command")
    parser.add_argument("--system", choices=["procrastinate", "pgqueuer"], required=True)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--rate", type=float, default=200)
    parser.add_argument("--warmup", type=float, default=0.0)
    parser.add_argument("--wait", action="store_true")
    args = parser.parse_args()
    commands = {
        "install": install,
        "ingest-single": lambda a: ingest(a, batch=1),
        "ingest-batch": lambda a: ingest(a, batch=a.batch),
        "pending": pending,
        "worker": worker,
        "latency": latency,
    }
    result = asyncio.run(commands[args.command](args))
    if args.command != "worker":
        print(json.dumps(result))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
