"""What a worker did: counts and latency percentiles in constant memory.

A worker may run for weeks and millions of jobs, so latencies go into a
log-bucketed histogram (about 1 % relative error) instead of a growing list.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jobqueue.lane import Outcomes

# Buckets grow by 2 % from 1 µs; 1,400 buckets reach past a day.
_SMALLEST = 1e-6
_GROWTH = 1.02
_LOG_GROWTH = math.log(_GROWTH)
_BUCKETS = 1400


class LatencyHistogram:
    """Counts of durations (seconds) in geometric buckets."""

    def __init__(self) -> None:
        self.counts = [0] * _BUCKETS
        self.total = 0
        self.sum = 0.0
        self.max = 0.0

    def add(self, seconds: float) -> None:
        self.add_many((seconds,))

    def add_many(self, values: Iterable[float]) -> None:
        """Count many durations (a batch's: this runs for every job, so it is
        written for speed, with everything it touches in locals)."""
        counts, log, last = self.counts, math.log, _BUCKETS - 1
        scale, inverse_smallest = 1 / _LOG_GROWTH, 1 / _SMALLEST
        n, total, largest = 0, 0.0, self.max
        for seconds in values:
            n += 1
            if seconds <= _SMALLEST:
                counts[0] += 1
                total += max(seconds, 0.0)
            else:
                index = int(log(seconds * inverse_smallest) * scale) + 1
                counts[index if index < last else last] += 1
                total += seconds
                if seconds > largest:
                    largest = seconds
        self.total += n
        self.sum += total
        self.max = largest

    def quantile(self, q: float) -> float | None:
        """The q-quantile (0 < q <= 1), or None when nothing was recorded."""
        if not self.total:
            return None
        rank = max(1, math.ceil(q * self.total))
        seen = 0
        for index, count in enumerate(self.counts):
            seen += count
            if seen >= rank:
                if index == 0:
                    return _SMALLEST
                # Geometric middle of the bucket, never above the largest value seen.
                upper = _SMALLEST * _GROWTH**index
                return min(upper / math.sqrt(_GROWTH), self.max)
        return self.max

    def summary_ms(self) -> dict[str, float | None]:
        def ms(v: float | None) -> float | None:
            return None if v is None else round(v * 1000, 3)

        return {
            "p50": ms(self.quantile(0.50)),
            "p95": ms(self.quantile(0.95)),
            "p99": ms(self.quantile(0.99)),
            "max": ms(self.max if self.total else None),
        }


@dataclass
class WorkerStats:
    """Counts since the worker became active."""

    completed: int = 0
    failed: int = 0
    retried: int = 0
    handed_back: int = 0
    rescued: int = 0
    batches: int = 0
    handler_time: LatencyHistogram = field(default_factory=LatencyHistogram)
    latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    started: float | None = None
    stopped: float | None = None

    def start_clock(self) -> None:
        if self.started is None:
            self.started = time.perf_counter()

    def count_batch(self, out: Outcomes, latencies: list[float]) -> None:
        """Add a committed batch's outcomes."""
        self.batches += 1
        self.completed += len(out.done_ids)
        retried = sum(out.retry)
        self.retried += retried
        self.failed += len(out.failed_ids) - retried
        self.handed_back += len(out.not_started)
        self.handler_time.add_many(out.handler_times)
        self.latency.add_many(latencies)

    def stop_clock(self) -> None:
        self.stopped = time.perf_counter()

    @property
    def elapsed(self) -> float:
        if self.started is None:
            return 0.0
        return (self.stopped or time.perf_counter()) - self.started

    def report(self) -> dict[str, Any]:
        """The figures `JobRunner.run()` returns and logs.

        processed: jobs completed. failed: jobs that ended failed. retried:
        failed attempts that were scheduled again. error_rate: failed attempts
        over all attempts. throughput: finished jobs per second while active.
        handler_ms: time inside handlers. latency_ms: from enqueue (or due
        time, for scheduled jobs and retries) to the completing statement.
        """
        attempts = self.completed + self.failed + self.retried
        elapsed = self.elapsed
        return {
            "elapsed_seconds": round(elapsed, 3),
            "processed": self.completed,
            "failed": self.failed,
            "retried": self.retried,
            "handed_back": self.handed_back,
            "rescued": self.rescued,
            "batches": self.batches,
            "error_rate": round((self.failed + self.retried) / attempts, 4) if attempts else 0.0,
            "throughput_per_sec": (
                round((self.completed + self.failed) / elapsed, 1) if elapsed > 0 else 0.0
            ),
            "handler_ms": self.handler_time.summary_ms(),
            "latency_ms": self.latency.summary_ms(),
        }
