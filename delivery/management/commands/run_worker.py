"""`manage.py run_worker`: claims due notifications and delivers them (contract section 1).

SIGTERM/SIGINT: stop claiming, finish in-flight deliveries, give claimed-but-unstarted
notifications back to PENDING without using an attempt, exit 0.
"""

import gc
import signal

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError
from prometheus_client import start_http_server

from delivery.circuits.services import CircuitPolicy
from delivery.providers import providers_from_settings
from delivery.services import RetryPolicy
from delivery.worker import Worker, WorkerConfig
from ratelimits.services import RateLimit
from webhooks.sender import WebhookSender


def positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ValueError(value)
    return number


def worker_from_settings(*, concurrency: int, batch_size: int) -> Worker:
    """A delivery worker configured from the settings, as `run_worker` runs it (also what
    bench/pg_instructions.py measures)."""
    return Worker(
        providers=providers_from_settings(),
        config=WorkerConfig(
            concurrency=concurrency,
            batch_size=batch_size,
            claim_timeout_s=settings.NOTIFYQUEUE_CLAIM_TIMEOUT_SECONDS,
            priority_aging_s=settings.NOTIFYQUEUE_PRIORITY_AGING_SECONDS,
            send_timeout_s=settings.NOTIFYQUEUE_PROVIDER_TIMEOUT_SECONDS,
            poll_interval_s=settings.NOTIFYQUEUE_POLL_INTERVAL_SECONDS,
            heartbeat_s=settings.NOTIFYQUEUE_HEARTBEAT_SECONDS,
            dead_after_s=settings.NOTIFYQUEUE_WORKER_DEAD_AFTER_SECONDS,
            rate_limit=RateLimit(
                limit=settings.NOTIFYQUEUE_RATE_LIMIT,
                window_s=settings.NOTIFYQUEUE_RATE_LIMIT_WINDOW_SECONDS,
                ceiling=settings.NOTIFYQUEUE_RECIPIENT_RATE_LIMIT,
            ),
            circuit=CircuitPolicy(
                threshold=settings.NOTIFYQUEUE_CIRCUIT_FAILURE_THRESHOLD,
                cooldown_s=settings.NOTIFYQUEUE_CIRCUIT_COOLDOWN_SECONDS,
                # A probe unanswered for twice the provider timeout lost its worker.
                probe_timeout_s=2 * settings.NOTIFYQUEUE_PROVIDER_TIMEOUT_SECONDS,
                max_hold_s=settings.NOTIFYQUEUE_CIRCUIT_MAX_HOLD_SECONDS,
            ),
            receipt_channels=frozenset(
                channel
                for channel, provider in settings.NOTIFYQUEUE_PROVIDERS.items()
                if provider.get("events_secrets")
            ),
            receipt_pending_s=settings.NOTIFYQUEUE_RECEIPT_PENDING_SECONDS,
            receipt_tolerance_s=settings.NOTIFYQUEUE_RECEIPT_TOLERANCE_SECONDS,
        ),
        policy=RetryPolicy(
            base_s=settings.NOTIFYQUEUE_BACKOFF_BASE_SECONDS,
            max_s=settings.NOTIFYQUEUE_BACKOFF_MAX_SECONDS,
        ),
    )


class Command(BaseCommand):
    help = "Runs a delivery worker until SIGTERM/SIGINT (or, with --until-empty, until idle)."

    def add_arguments(self, parser):
        parser.add_argument("--concurrency", type=positive_int, default=8)
        parser.add_argument(
            "--batch-size",
            type=positive_int,
            default=WorkerConfig.batch_size,
            help=f"the most rows one claim takes (default {WorkerConfig.batch_size})",
        )
        parser.add_argument("--until-empty", action="store_true")
        parser.add_argument(
            "--metrics-port",
            type=int,
            help="serve this worker's Prometheus metrics on http://0.0.0.0:PORT/metrics",
        )

    def handle(self, *args, concurrency, batch_size, until_empty, metrics_port, **options):
        claim_timeout_s = settings.NOTIFYQUEUE_CLAIM_TIMEOUT_SECONDS
        send_timeout_s = settings.NOTIFYQUEUE_PROVIDER_TIMEOUT_SECONDS
        if claim_timeout_s < 2 * send_timeout_s:
            # A send that can outlast its claim is taken over and sent again by another worker
            # (a duplicate for providers without idempotency, such as SMTP).
            raise CommandError(
                f"NOTIFYQUEUE_CLAIM_TIMEOUT_SECONDS ({claim_timeout_s:g}) must be at least twice "
                f"NOTIFYQUEUE_PROVIDER_TIMEOUT_SECONDS ({send_timeout_s:g}): a claim must outlive "
                "the slowest provider call, or another worker takes it over and sends it again"
            )
        try:
            worker = worker_from_settings(concurrency=concurrency, batch_size=batch_size)
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from exc
        webhooks = WebhookSender(
            poll_interval_s=settings.NOTIFYQUEUE_POLL_INTERVAL_SECONDS,
            reclaim_interval_s=settings.NOTIFYQUEUE_HEARTBEAT_SECONDS,
            # The worker's heartbeat vouches for the sender's claims too: they are taken over
            # when it dies, like its notifications.
            worker=worker.worker_id,
        )

        def stop(*_):
            worker.stop()
            webhooks.stop()

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, stop)
        self.stderr.write(
            f"worker {worker.worker_id} started: concurrency={concurrency} batch={batch_size}"
        )
        if not settings.NOTIFYQUEUE_PUBLIC_URL:
            self.stderr.write(
                "NOTIFYQUEUE_PUBLIC_URL is not set: emails carry no List-Unsubscribe header"
            )
        if metrics_port is not None:
            try:
                start_http_server(metrics_port)
            except OSError as exc:
                raise CommandError(f"--metrics-port {metrics_port}: {exc}") from exc
            self.stderr.write(f"metrics on http://0.0.0.0:{metrics_port}/metrics")
        # What start-up built lives as long as the process: out of the collector's sight, a
        # full collection no longer walks it, holding every thread, for 70-100 ms
        # (docs/decisions/0023-start-up-objects-frozen.md).
        gc.freeze()
        webhooks.start()
        try:
            worker.run(until_empty=until_empty)
        finally:
            # After --until-empty, deliver the webhooks that run produced before exiting.
            webhooks.stop(drain=until_empty)
            webhooks.join()
        self.stderr.write(f"worker {worker.worker_id} stopped: delivered={worker.delivered}")
