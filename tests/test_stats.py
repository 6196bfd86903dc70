"""The worker's latency histogram: constant memory, about 2 % relative error."""

from __future__ import annotations

import random
import statistics

from jobqueue.worker.stats import LatencyHistogram


def test_quantiles_are_within_the_bucket_width_of_the_exact_ones() -> None:
    rng = random.Random(7)
    values = [rng.lognormvariate(-6, 1.5) for _ in range(20_000)]  # ~2.5 ms median, long tail
    h = LatencyHistogram()
    h.add_many(values[:10_000])
    for v in values[10_000:]:
        h.add(v)
    assert h.total == len(values)
    assert abs(h.sum - sum(values)) < 1e-9 * len(values)
    assert h.max == max(values)
    # Linear interpolation between order statistics, as percentile_cont does.
    exact_quantiles = statistics.quantiles(values, n=100, method="inclusive")
    for q in (0.5, 0.95, 0.99):
        exact = exact_quantiles[round(q * 100) - 1]
        got = h.quantile(q)
        assert got is not None and abs(got - exact) / exact < 0.02, (q, got, exact)


def test_tiny_negative_and_huge_values_land_in_the_end_buckets() -> None:
    h = LatencyHistogram()
    h.add_many([-1.0, 0.0, 1e-9, 1e9])
    assert h.counts[0] == 3 and h.counts[-1] == 1
    assert h.total == 4 and h.sum == 1e-9 + 1e9
    assert h.quantile(0.5) == 1e-6 and 1e6 < (h.quantile(1.0) or 0) <= h.max
    assert LatencyHistogram().quantile(0.5) is None
