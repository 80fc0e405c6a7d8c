"""django-prometheus' per-view request metrics, at a fraction of their cost.

`PrometheusAfterMiddleware` records the same series as django-prometheus' own (the operations
alerts read them: docs/operations.md), but keeps each labelled child it has used: prometheus_client
checks and orders the label names, builds the key and takes a lock on every `labels()` call,
seven of them a request, about a fifth of a create's CPU in the API with the rest of the
middleware. The cache holds at most CHILDREN_KEPT children: django-prometheus labels its
latency series with the request's method as sent, so a client inventing methods makes new
series (its metric grows as it did; the cache stops growing at its bound).
"""

from __future__ import annotations

import time
from typing import Any

from django_prometheus import middleware

from monitoring.metrics import LabelledChildren

CHILDREN_KEPT = 10_000


class PrometheusAfterMiddleware(middleware.PrometheusAfterMiddleware):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._children = LabelledChildren(kept=CHILDREN_KEPT)

    def label_metric(self, metric: Any, request: Any, response: Any = None, **labels: Any) -> Any:
        return self._children.get(metric, **labels) if labels else metric


class ShortcutMetrics:
    """The series django-prometheus' two middleware record for a request, recorded for an
    answer given before Django's handler (notifyqueue/shortcuts.py): the same metrics and
    labels. The labelled children of one kind of answer (view, transport, status, charset)
    are looked up once and kept together (at most CHILDREN_KEPT kinds), and the request's
    headers are read from its WSGI environ: Django's `request.headers` builds a mapping of
    every header on first use, and the middleware's series cost a sixth of a create's CPU in
    one process that way (docs/performance.md, "Ninth round")."""

    def __init__(self) -> None:
        self.metrics = middleware.Metrics.get_instance()
        self._kinds: dict[tuple[str, str, int, str], tuple[tuple[Any, ...], Any]] = {}

    def _series(self, view: str, transport: str, status: str, charset: str) -> tuple:
        """The counters a request of this kind increments, and its latency histogram."""
        m = self.metrics
        counters = (
            m.requests_total,
            m.requests_by_method.labels(method="POST"),
            m.requests_by_transport.labels(transport=transport),
            m.requests_by_view_transport_method.labels(
                view=view, transport=transport, method="POST"
            ),
            m.responses_by_status.labels(status=status),
            m.responses_by_status_view_method.labels(status=status, view=view, method="POST"),
            m.responses_by_charset.labels(charset=charset),
            # A DRF answer is a template response with no template: the long way counts it.
            m.responses_by_templatename.labels(templatename="None"),
            m.responses_total,
        )
        return counters, m.requests_latency_by_view_method.labels(view=view, method="POST")

    def __call__(self, request: Any, response: Any, view: str, started: float) -> None:
        m = self.metrics
        meta = request.META
        transport = "https" if request.is_secure() else "http"
        kind = (view, transport, response.status_code, response.charset)
        series = self._kinds.get(kind)
        if series is None:
            series = self._series(view, transport, str(response.status_code), str(kind[3]))
            if len(self._kinds) < CHILDREN_KEPT:
                self._kinds[kind] = series
        counters, latency = series
        for counter in counters:
            counter.inc()
        if meta.get("HTTP_X_REQUESTED_WITH") == "XMLHttpRequest":
            m.requests_ajax.inc()
        m.requests_body_bytes.observe(int(meta.get("CONTENT_LENGTH") or 0))
        m.responses_body_bytes.observe(len(response.content))
        elapsed = time.perf_counter() - started
        latency.observe(elapsed)
        m.requests_latency_before.observe(elapsed)
