"""Histogram.coarse: the fleet's fewer bounds, checked against counting the observed values."""
from __future__ import annotations

import random

import pytest

from memprof_otel.metric_names import (DURATION_BUCKETS, FLEET_DURATION_BUCKETS, FLEET_MEMORY_PEAK_BUCKETS,
                                       MEMORY_PEAK_BUCKETS)
from memprof_otel.telemetry.operation_stats import Histogram


@pytest.mark.parametrize(("full", "coarse", "scale"), [(DURATION_BUCKETS, FLEET_DURATION_BUCKETS, 100.0),
                                                      (MEMORY_PEAK_BUCKETS, FLEET_MEMORY_PEAK_BUCKETS, 2.0 ** 36)])
def test_each_kept_bucket_counts_the_values_at_or_below_its_bound(full, coarse, scale) -> None:
    rng = random.Random(7)
    # values on the bounds themselves too: le is "at or below"
    values = [rng.random() ** 4 * scale for _ in range(500)] + list(full) + [scale * 10]
    h = Histogram(full)
    for i, v in enumerate(values):
        h.observe(v, trace_id=f"t{i}", ts=float(i))
    c = h.coarse(coarse)
    cumulative = {le: n for le, n, _ in c.cumulative()}
    expected = {**{str(int(b)) if b.is_integer() else repr(b): sum(v <= b for v in values) for b in coarse},
                "+Inf": len(values)}
    assert cumulative == expected
    assert (c.count, c.sum) == (h.count, h.sum)
    # each kept bucket's exemplar is the latest observation that fell into it
    for j, ex in enumerate(c.exemplars):
        lo = coarse[j - 1] if j else float("-inf")
        hi = coarse[j] if j < len(coarse) else float("inf")
        latest = max((i for i, v in enumerate(values) if lo < v <= hi), default=None)
        assert (ex[0] if ex else None) == (f"t{latest}" if latest is not None else None)


def test_bounds_that_are_not_the_histograms_own_are_refused() -> None:
    with pytest.raises(ValueError, match="not bounds of this histogram"):
        Histogram(DURATION_BUCKETS).coarse((0.02,))
