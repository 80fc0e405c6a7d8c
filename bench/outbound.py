"""The cost of one guarded outbound POST (notifyqueue/outbound.py), alone: `--threads` threads
each POST `--posts` times, one after another, to a loopback HTTP/1.1 server (asyncio, keep-alive,
its own process) that answers each request after `--delay-ms`.

    .venv/bin/python bench/outbound.py                       # this tree's outbound.py
    .venv/bin/python bench/outbound.py --code /tmp/before    # another tree's (a git worktree)

Prints, per run and as the median of `--runs`: POSTs/s, the client process's CPU per POST
(user + system, the server's excluded), the TCP connections the server accepted and the most
threads the client process had during the run. With `--threads` in flight and a `--delay-ms`
answer, the ceiling is threads / delay (1,000/s for the defaults).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def serve(delay_s: float) -> None:
    counts = {"accepted": 0, "requests": 0}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        counts["accepted"] += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                await reader.readexactly(length)
                if head.startswith(b"GET /stats"):
                    body = json.dumps(counts).encode()
                else:
                    counts["requests"] += 1
                    await asyncio.sleep(delay_s)
                    body = b'{"message_id": "m"}'
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
        print(server.sockets[0].getsockname()[1], flush=True)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def server_counts(port: int) -> dict[str, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=5) as answer:
        return json.loads(answer.read())


def run_once(outbound, port: int, threads: int, posts: int) -> dict[str, float]:
    url = f"http://127.0.0.1:{port}/send"
    body = json.dumps({"id": "x", "channel": "sms", "recipient": "+1555", "body": "hi"}).encode()

    def one_thread() -> int:
        ok = 0
        for _ in range(posts):
            answer = outbound.outbound_post(
                url=url,
                body=body,
                headers={"Content-Type": "application/json", "Idempotency-Key": "k"},
                timeout_s=10,
                allow_private=True,
            )
            ok += answer.status_code == 200
        return ok

    before = server_counts(port)
    peak_threads = threading.active_count()
    cpu_started, started = time.process_time(), time.monotonic()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        futures = [pool.submit(one_thread) for _ in range(threads)]
        while not all(f.done() for f in futures):
            peak_threads = max(peak_threads, threading.active_count())
            time.sleep(0.005)
        ok = sum(f.result() for f in futures)
    elapsed, cpu = time.monotonic() - started, time.process_time() - cpu_started
    after = server_counts(port)
    total = threads * posts
    return {
        "ok": ok,
        "posts_per_s": total / elapsed,
        "cpu_ms_per_post": cpu / total * 1000,
        # The /stats request itself accounts for one connection.
        "connections": after["accepted"] - before["accepted"] - 1,
        "peak_threads": peak_threads,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=50)
    parser.add_argument("--posts", type=int, default=40, help="POSTs per thread, in sequence")
    parser.add_argument("--delay-ms", type=float, default=50)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--code", type=Path, default=ROOT, help="tree to import notifyqueue from")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.delay_ms / 1000)
        return

    sys.path.insert(0, str(args.code.resolve()))
    from notifyqueue import outbound

    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", "--delay-ms", str(args.delay_ms)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(server.stdout.readline())
        print(f"outbound from {Path(outbound.__file__).resolve()}; pid {os.getpid()}")
        print(
            f"{args.threads} threads x {args.posts} POSTs, answer after {args.delay_ms:g} ms "
            f"(ceiling {args.threads / args.delay_ms * 1000:,.0f}/s)"
        )
        results = []
        for run in range(1, args.runs + 1):
            result = run_once(outbound, port, args.threads, args.posts)
            results.append(result)
            print(
                f"run {run}: {result['posts_per_s']:,.0f} POSTs/s, "
                f"{result['cpu_ms_per_post']:.2f} ms CPU/POST, "
                f"{result['connections']} connections, {result['peak_threads']} threads at most, "
                f"{result['ok']} answered 200"
            )
        rate = statistics.median(r["posts_per_s"] for r in results)
        cpu = statistics.median(r["cpu_ms_per_post"] for r in results)
        print(f"median: {rate:,.0f} POSTs/s, {cpu:.2f} ms CPU/POST")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
