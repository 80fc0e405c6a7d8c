"""The machine's limit for webhook POSTs: a bare loop, no queue, no database.

`--in-flight` threads, each with one keep-alive connection, POST `--events` signed events
(Standard Webhooks headers: webhook-id, webhook-timestamp and an HMAC-SHA256 `v1,` signature
over `id.timestamp.body`, the body shaped as Notify Queue's) to `--url`, one after another;
prints the POSTs per second from the first request to the last answer as JSON. The benchmark
runs it in its own process against the webhook rows' receiver, with as many in flight as one
client may have, so that the webhook rows can be read against it.

    python bench/webhook_loop.py --url http://127.0.0.1:8080/send --in-flight 4 --events 5000
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import http.client
import itertools
import json
import threading
import time
import uuid
from urllib.parse import urlsplit

SECRET = b"bench-webhook-loop-key-012345678"


def signed(n: int) -> tuple[bytes, dict[str, str]]:
    event_id = f"loop-{uuid.uuid4()}"
    body = json.dumps(
        {
            "eventId": event_id,
            "jobId": str(uuid.uuid4()),
            "status": "SENT",
            "attemptCount": 1,
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "type": "status",
        },
        separators=(",", ":"),
    ).encode()
    stamp = str(int(time.time()))
    digest = hmac.new(SECRET, f"{event_id}.{stamp}.".encode() + body, hashlib.sha256).digest()
    return body, {
        "Content-Type": "application/json",
        "User-Agent": "bench-webhook-loop",
        "webhook-id": event_id,
        "webhook-timestamp": stamp,
        "webhook-signature": "v1," + base64.b64encode(digest).decode(),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--in-flight", type=int, default=4)
    parser.add_argument("--events", type=int, default=5000)
    args = parser.parse_args()
    parts = urlsplit(args.url)
    numbers = itertools.count()
    failures = [0]
    lock = threading.Lock()

    def loop() -> None:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        while True:
            with lock:
                n = next(numbers)
            if n >= args.events:
                return
            body, headers = signed(n)
            conn.request("POST", parts.path or "/", body, headers)
            response = conn.getresponse()
            response.read()
            if not 200 <= response.status < 300:
                failures[0] += 1

    threads = [threading.Thread(target=loop) for _ in range(args.in_flight)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    print(json.dumps({"rate": args.events / elapsed, "failures": failures[0]}))


if __name__ == "__main__":
    main()
