"""The shortcut's request metrics, written in batches (monitoring/middleware.py), write what
django-prometheus' one-request-at-a-time writes would have: every bucket, sum and count; and
what a process counted is written by that process only."""

from __future__ import annotations

import math
import os
import time

import pytest
from prometheus_client import CollectorRegistry, Histogram

from monitoring import middleware
from monitoring.middleware import ShortcutMetrics, _Counted, histogram_add

BUCKETS = (0.01, 0.1, 1.0, 10.0)
# On each bound, between bounds, below the first, past the last, zero and negative.
VALUES = (0.0, -1.0, 0.005, 0.01, 0.05, 0.1, 0.1000001, 1.0, 5.0, 10.0, 11.0, 1e9)


def _histogram(registry: CollectorRegistry) -> Histogram:
    return Histogram("h", "a histogram", buckets=BUCKETS, registry=registry)


def _samples(histogram: Histogram) -> dict[tuple, float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for metric in histogram.collect()
        for sample in metric.samples
        if not sample.name.endswith("_created")
    }


@pytest.mark.parametrize("values", [VALUES, VALUES[:1], (0.05,) * 7, ()])
def test_a_batch_writes_what_observing_each_value_writes(values):
    observed = _histogram(CollectorRegistry())
    for value in values:
        observed.observe(value)

    batched = _histogram(CollectorRegistry())
    counted = _Counted()
    for value in values:
        counted._observe(batched, value)
    for histogram, (buckets, total) in counted.histograms.items():
        histogram_add(histogram, buckets, total)

    assert _samples(batched) == pytest.approx(_samples(observed))
    assert _samples(batched)[("h_count", ())] == len(values)


def test_every_bucket_bound_is_the_histograms_own_with_inf_last():
    histogram = _histogram(CollectorRegistry())
    assert list(histogram._upper_bounds) == [*BUCKETS, math.inf]
    assert len(histogram._buckets) == len(histogram._upper_bounds)


class _Request:
    META = {"CONTENT_LENGTH": "80", "wsgi.url_scheme": "http"}

    def is_secure(self) -> bool:
        return False


class _Response:
    status_code = 201
    charset = "utf-8"
    content = b"{}"


def test_a_process_forked_after_counting_does_not_write_the_parents_counts_again():
    """What the parent counted and has not written is the parent's to write: a child that kept
    it would write it a second time (its own file, summed with the parent's)."""
    recorder = ShortcutMetrics()
    # Held, the parent's once-a-second flusher cannot take the count before it is looked at.
    with middleware._WRITING:
        recorder(_Request(), _Response(), "notification-list", time.perf_counter())
        pid = os.fork()
        if pid == 0:  # the child: exits at once, without the parent's atexit hooks
            os._exit(0 if not recorder._counted.kinds and middleware._flusher is None else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert sum(recorder._counted.kinds.values()) == 1  # still the parent's, to write once
    recorder.flush()
    assert not recorder._counted.kinds
