"""django-prometheus' per-view request metrics, at a fraction of their cost.

`PrometheusAfterMiddleware` records the same series as django-prometheus' own (the operations
alerts read them: docs/operations.md), but keeps each labelled child it has used: prometheus_client
checks and orders the label names, builds the key and takes a lock on every `labels()` call,
seven of them a request, about a fifth of a create's CPU in the API with the rest of the
middleware. Every label's values are bounded: a method that is not a standard one is
labelled UNKNOWN_METHOD in every series (django-prometheus labels its latency series with the
method as sent, so a client inventing methods would add series to the public /metrics
without end), and the cache holds at most CHILDREN_KEPT children.
"""

from __future__ import annotations

import atexit
import bisect
import logging
import os
import threading
import time
import weakref
from typing import Any

from django_prometheus import middleware

from monitoring.metrics import LabelledChildren

logger = logging.getLogger(__name__)

CHILDREN_KEPT = 10_000
# Every method label is one of these, or UNKNOWN_METHOD (django-prometheus' own word for it).
KNOWN_METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "DELETE", "TRACE", "OPTIONS", "CONNECT", "PATCH"}
)
UNKNOWN_METHOD = "<invalid method>"
# The longest a request counted by ShortcutMetrics waits to be written.
FLUSH_EVERY_S = 1.0


class PrometheusAfterMiddleware(middleware.PrometheusAfterMiddleware):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._children = LabelledChildren(kept=CHILDREN_KEPT)

    def label_metric(self, metric: Any, request: Any, response: Any = None, **labels: Any) -> Any:
        if not labels:
            return metric
        method = labels.get("method")
        if method is not None and method not in KNOWN_METHODS:
            # django-prometheus maps an unknown method to this for most series, but labels its
            # latency series with the method as sent: any client could add series at will.
            labels["method"] = UNKNOWN_METHOD
        return self._children.get(metric, **labels)


class ShortcutMetrics:
    """The series django-prometheus' two middleware record for a request, recorded for an
    answer given before Django's handler (notifyqueue/serving/shortcuts.py): the same metrics and
    labels, written in batches.

    A request only counts itself in memory (its kind of answer and four histogram buckets,
    under one lock); what was counted is written to prometheus_client's values at most
    FLUSH_EVERY_S later, by a thread of this process, when this process serves /metrics
    (`flush_request_metrics`), and when it exits normally. Written one request at a time
    the 13 series cost about a tenth of a create's CPU in the API: under gunicorn each write
    goes to the process's multi-process file under one lock, with a `getpid()` each. So a
    scrape answered by another process shows
    this one's requests up to FLUSH_EVERY_S late, and a process killed (SIGKILL) loses at
    most that much of its request counts. The labelled children of one kind of answer (view,
    transport, status, charset) are looked up once and kept together (at most CHILDREN_KEPT
    kinds; past that a kind is written at once), and the request's headers are read from its
    WSGI environ: Django's `request.headers` builds a mapping of every header on first use."""

    def __init__(self) -> None:
        self.metrics = middleware.Metrics.get_instance()
        self._kinds: dict[tuple[str, str, int, str], tuple[tuple[Any, ...], Any]] = {}
        self._lock = threading.Lock()  # held to count, and to take what was counted
        self._counted = _Counted()
        with _STARTING:
            _RECORDERS.add(self)

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
            if len(self._kinds) >= CHILDREN_KEPT:
                counted = _Counted()
                counted.add(series, meta, response, time.perf_counter() - started, m)
                counted.write(m)
                return
            self._kinds[kind] = series
        elapsed = time.perf_counter() - started
        with self._lock:
            self._counted.add(series, meta, response, elapsed, m)
        if _flusher is None:
            _flusher_start()

    def flush(self) -> None:
        """Writes what was counted since the last flush (under _WRITING: a flush that returns
        has written everything counted before it began, whoever was writing it)."""
        with _WRITING:
            with self._lock:
                counted, self._counted = self._counted, _Counted()
            counted.write(self.metrics)

    def _after_fork(self) -> None:
        # The parent writes what it counted; the child starts with nothing counted.
        self._lock = threading.Lock()
        self._counted = _Counted()


class _Counted:
    """Requests counted since a flush: how many of each kind, and each histogram's buckets."""

    __slots__ = ("ajax", "histograms", "kinds")

    def __init__(self) -> None:
        self.kinds: dict[tuple, int] = {}  # by the kind's series (ShortcutMetrics._series)
        self.ajax = 0
        self.histograms: dict[Any, tuple[list[int], list[float]]] = {}

    def add(self, series: tuple, meta: dict, response: Any, elapsed: float, m: Any) -> None:
        self.kinds[series] = self.kinds.get(series, 0) + 1
        if meta.get("HTTP_X_REQUESTED_WITH") == "XMLHttpRequest":
            self.ajax += 1
        self._observe(m.requests_body_bytes, int(meta.get("CONTENT_LENGTH") or 0))
        self._observe(m.responses_body_bytes, len(response.content))
        self._observe(series[1], elapsed)
        self._observe(m.requests_latency_before, elapsed)

    def _observe(self, histogram: Any, value: float) -> None:
        pending = self.histograms.get(histogram)
        if pending is None:
            pending = self.histograms[histogram] = ([0] * len(histogram._upper_bounds), [0.0])
        buckets, total = pending
        buckets[bisect.bisect_left(histogram._upper_bounds, value)] += 1
        total[0] += value

    def write(self, m: Any) -> None:
        for (counters, _), count in self.kinds.items():
            for counter in counters:
                counter.inc(count)
        if self.ajax:
            m.requests_ajax.inc(self.ajax)
        for histogram, (buckets, total) in self.histograms.items():
            histogram_add(histogram, buckets, total)


def histogram_add(histogram: Any, buckets: list[int], total: list[float]) -> None:
    """What `histogram.observe(v)` for each of several values writes, written once: each
    bucket's count (`buckets[i]` values fell in the i-th, the first whose upper bound is >= v)
    and their sum. prometheus_client has no public call for this; its Histogram keeps one
    value per bucket (`_buckets`, bounded by `_upper_bounds`) and the sum (`_sum`), as it has
    since its first releases (tests/unit/test_request_metrics_batched.py holds the written
    samples equal to observe's for every bucket)."""
    histogram._sum.inc(total[0])
    for bucket, count in zip(histogram._buckets, buckets, strict=True):
        if count:
            bucket.inc(count)


# Every recorder of this process, for `flush_request_metrics`, the exit and forks (added to and
# read under _STARTING).
_RECORDERS: weakref.WeakSet[ShortcutMetrics] = weakref.WeakSet()
_WRITING = threading.Lock()
_STARTING = threading.Lock()
_flusher: threading.Thread | None = None  # this process's, once something was counted


def flush_request_metrics() -> None:
    """Writes every request this process counted and has not written yet (the /metrics view
    calls this before it reads the values)."""
    with _STARTING:
        recorders = list(_RECORDERS)
    for recorder in recorders:
        recorder.flush()


def _flush_every() -> None:
    while True:
        time.sleep(FLUSH_EVERY_S)
        try:
            flush_request_metrics()
        except Exception:  # the next second tries again; what was taken is lost, and logged
            logger.exception("writing the request metrics failed")


def _flusher_start() -> None:
    global _flusher
    with _STARTING:
        if _flusher is None:
            _flusher = threading.Thread(target=_flush_every, name="request-metrics", daemon=True)
            _flusher.start()


def _after_fork_in_child() -> None:
    global _WRITING, _STARTING, _flusher
    _WRITING, _STARTING, _flusher = threading.Lock(), threading.Lock(), None
    for recorder in list(_RECORDERS):
        recorder._after_fork()


atexit.register(flush_request_metrics)
os.register_at_fork(after_in_child=_after_fork_in_child)
