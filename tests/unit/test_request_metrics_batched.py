"""The shortcut's request metrics, written in batches (monitoring/middleware.py), write what
django-prometheus' one-request-at-a-time writes would have: every bucket, sum and count."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Histogram

from monitoring.middleware import _Counted, histogram_add

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
