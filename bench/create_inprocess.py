"""CPU per create in one process, through the WSGI application, without gunicorn.

    NOTIFYQUEUE_DEV_EMBEDDED_DB=1 .venv/bin/python bench/create_inprocess.py [--long-way]
        [--creates 3000] [--rounds 3] [--batch 1000]

Calls `notifyqueue.wsgi.application` (or, with --long-way, Django's application under it,
without the create endpoints' shortcut) with a WSGI environ per request, as gunicorn would,
and prints `time.process_time()` and wall time per create for each round. Each request has
its own Idempotency-Key and is answered 201; a client is made for the run (`create_client`).
With --batch N, each request posts N items to /notifications/batch (answered 200), each with
its own key, as the benchmark's batch row does; the bodies are written before the clock starts.
Uses the database of the environment (the embedded one with the switch above, or
DATABASE_URL) and leaves its client and rows there: run it on a development database. The API
throttle is off, as in the benchmark's create rows.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "notifyqueue.settings")
os.environ["NOTIFYQUEUE_API_RATE_LIMIT"] = "0"
os.environ.setdefault("LOG_LEVEL", "ERROR")
os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="create-inprocess-"))

BODY = json.dumps(
    {"channel": "email", "recipient": "bench@example.com", "subject": "Hi", "body": "Code 1"}
).encode()


def batch_body(prefix: str, size: int) -> bytes:
    item = {"channel": "email", "recipient": "bench@example.com", "subject": "Hi", "body": "Code 1"}
    items = [{**item, "idempotency_key": f"{prefix}-{n}"} for n in range(size)]
    return json.dumps({"notifications": items}).encode()


def environ(api_key: str, key: str, body: bytes = BODY) -> dict:
    return {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/api/v1/notifications" if body is BODY else "/api/v1/notifications/batch",
        "SCRIPT_NAME": "",
        "QUERY_STRING": "",
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8000",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.version": (1, 0),
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(body)),
        "HTTP_HOST": "127.0.0.1:8000",
        "HTTP_AUTHORIZATION": f"Api-Key {api_key}",
        "HTTP_IDEMPOTENCY_KEY": key,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--long-way", action="store_true", help="without the shortcut")
    parser.add_argument("--creates", type=int, default=3000, help="per round (default 3000)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, metavar="N", help="N items per batch request")
    args = parser.parse_args()

    from django.core.management import call_command

    from notifyqueue import wsgi

    app = wsgi.django_application if args.long_way else wsgi.application
    made = io.StringIO()
    call_command("create_client", f"inprocess-{uuid.uuid4().hex[:8]}", stdout=made)
    api_key = json.loads(made.getvalue())["api_key"]
    statuses: set[str] = set()

    def start_response(status: str, headers: list, exc_info=None) -> None:
        statuses.add(status)

    def requests(count: int, prefix: str) -> list[dict]:
        if not args.batch:
            return [environ(api_key, f"{prefix}-{n}") for n in range(count)]
        bodies = (batch_body(f"{prefix}-{n}", args.batch) for n in range(count // args.batch))
        return [environ(api_key, f"{prefix}-batch", body) for body in bodies]

    def run(environs: list[dict]) -> None:
        for request in environs:
            answer = app(request, start_response)
            b"".join(answer)
            if hasattr(answer, "close"):
                answer.close()

    # The key remembered, the statements' first runs done.
    run(requests(3 * (args.batch or 100), "warm"))
    way = "long way" if args.long_way else "shortcut"
    for r in range(args.rounds):
        environs = requests(args.creates, f"r{r}")
        cpu, wall = time.process_time(), time.perf_counter()
        run(environs)
        cpu = (time.process_time() - cpu) / args.creates * 1e6
        wall = (time.perf_counter() - wall) / args.creates * 1e6
        print(f"{way}, round {r}: {cpu:.0f} µs CPU and {wall:.0f} µs wall per create")
    if statuses != {"200 OK" if args.batch else "201 Created"}:
        raise SystemExit(f"unexpected answers: {sorted(statuses)}")


if __name__ == "__main__":
    main()
