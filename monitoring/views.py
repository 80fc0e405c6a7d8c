"""`GET /status` (no authentication) and `GET /metrics` (Prometheus text; see
NOTIFYQUEUE_METRICS_PUBLIC and NOTIFYQUEUE_METRICS_TOKEN)."""

from __future__ import annotations

import hmac
import os

import prometheus_client
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import multiprocess

from monitoring.metrics import queue_registry_build
from monitoring.repositories import HealthRepository
from monitoring.services import status_report, status_thresholds_from_settings

QUEUE_REGISTRY = queue_registry_build()


@never_cache
@require_GET
def status_view(request: HttpRequest) -> JsonResponse:
    report = status_report(
        source=HealthRepository(), now=timezone.now(), thresholds=status_thresholds_from_settings()
    )
    return JsonResponse(report.body, status=200 if report.healthy else 503)


@never_cache
@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    if not _metrics_allowed(request):
        response = HttpResponse("Metrics need a bearer token.\n", status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
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
    if settings.NOTIFYQUEUE_METRICS_PUBLIC:
        return True
    token = settings.NOTIFYQUEUE_METRICS_TOKEN
    given = request.headers.get("Authorization", "")
    return bool(token) and hmac.compare_digest(given.encode(), f"Bearer {token}".encode())
