"""`GET /status` and `GET /metrics` (Prometheus text; see NOTIFYQUEUE_METRICS_PUBLIC and
NOTIFYQUEUE_METRICS_TOKEN).

`/status` tells anyone only healthy or not (200 `{"status": "ok"}`, 503 `{"status":
"degraded"}`): enough for a load balancer, nothing for a prober. The details (reasons, queue
depths, workers, circuits) need an operator client's key (`Authorization: Api-Key <key>`) or
the metrics token (`Authorization: Bearer <token>`).
"""

from __future__ import annotations

import hmac
import os

import prometheus_client
from django.conf import settings
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import multiprocess

from clients.authentication import KEYWORD as API_KEY_KEYWORD
from clients.repositories import client_for_api_key
from health.metrics import queue_registry_build
from health.repositories import HealthRepository
from health.services import status_report, status_thresholds_from_settings
from monitoring.middleware import flush_request_metrics

QUEUE_REGISTRY = queue_registry_build()


@never_cache
@require_GET
def status_view(request: HttpRequest) -> JsonResponse:
    details = _status_details_allowed(request)
    report = status_report(
        source=HealthRepository(),
        now=timezone.now(),
        thresholds=status_thresholds_from_settings(),
        details=details,
    )
    body = report.body if details else {"status": report.body["status"]}
    return JsonResponse(body, status=200 if report.healthy else 503)


def _status_details_allowed(request: HttpRequest) -> bool:
    if _bearer_token_matches(request):
        return True
    keyword, _, key = request.headers.get("Authorization", "").partition(" ")
    if keyword != API_KEY_KEYWORD or not key.strip():
        return False
    try:
        client = client_for_api_key(key.strip())
    except DatabaseError:
        # No database, no way to check the key: the answer stays the anonymous one.
        return False
    return client is not None and client.is_operator


def _bearer_token_matches(request: HttpRequest) -> bool:
    token = settings.NOTIFYQUEUE_METRICS_TOKEN
    given = request.headers.get("Authorization", "")
    return bool(token) and hmac.compare_digest(given.encode(), f"Bearer {token}".encode())


@never_cache
@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    if not _metrics_allowed(request):
        response = HttpResponse("Metrics need a bearer token.\n", status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    flush_request_metrics()  # this process's own requests, counted and not yet written
    page = prometheus_client.generate_latest(_process_registry())
    page += prometheus_client.generate_latest(QUEUE_REGISTRY)
    return HttpResponse(page, content_type=prometheus_client.CONTENT_TYPE_LATEST)


def _process_registry():
    # Under a multi-process server (gunicorn with PROMETHEUS_MULTIPROC_DIR set) each process
    # writes its counters to that directory, and any one of them serves the sum.
    if "PROMETHEUS_MULTIPROC_DIR" in os.environ:
        registry = prometheus_client.CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return registry
    return prometheus_client.REGISTRY


def _metrics_allowed(request: HttpRequest) -> bool:
    return settings.NOTIFYQUEUE_METRICS_PUBLIC or _bearer_token_matches(request)
