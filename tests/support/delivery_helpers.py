"""Helpers for delivery tests: a movable clock, a worker builder, and a loopback provider."""

from __future__ import annotations

import json
import random
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from delivery.circuits.services import CircuitPolicy
from delivery.providers.in_app import InAppProvider
from delivery.providers.simulated import SimulatedProvider
from delivery.services import RetryPolicy
from delivery.worker import Worker, WorkerConfig
from tests.support.clock import DbClock

# The database's clock, moved by the test (see tests/support/clock.py).
FakeClock = DbClock


def simulated_providers(**kwargs) -> dict:
    simulated = SimulatedProvider(**kwargs)
    return {"email": simulated, "sms": simulated, "push": simulated, "in_app": InAppProvider()}


def worker_build(
    *,
    providers: dict | None = None,
    concurrency: int = 4,
    batch_size: int = 10,
    claim_timeout_s: float = 30.0,
    policy: RetryPolicy | None = None,
    worker_id: str | None = None,
    circuit: CircuitPolicy | None = None,
) -> Worker:
    return Worker(
        providers=providers or simulated_providers(),
        config=WorkerConfig(
            concurrency=concurrency,
            batch_size=batch_size,
            claim_timeout_s=claim_timeout_s,
            poll_interval_s=0.05,
            heartbeat_s=0.2,
            circuit=circuit,
        ),
        policy=policy or RetryPolicy(base_s=0.5, max_s=60.0),
        rng=random.Random(7),
        worker_id=worker_id,
    )


@dataclass
class ProviderCall:
    key: str
    body: dict


@dataclass
class LoopbackProvider:
    """A real HTTP provider on 127.0.0.1 that honours idempotency keys like a real one.

    `hold` (when set by the test) makes each request wait until `release` is set, after the
    provider has already accepted the message: what a worker dying mid-call looks like.
    """

    calls: list[ProviderCall] = field(default_factory=list)
    sent: dict[str, str] = field(default_factory=dict)
    received: threading.Event = field(default_factory=threading.Event)
    hold: bool = False
    release: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> str:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                key = self.headers["Idempotency-Key"]
                with provider._lock:
                    provider.calls.append(ProviderCall(key, body))
                    message_id = provider.sent.setdefault(key, f"msg-{uuid.uuid4()}")
                provider.received.set()
                if provider.hold:
                    provider.release.wait(30)
                answer = json.dumps({"message_id": message_id}).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the worker died while waiting: the point of some tests

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_port}/send"

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
