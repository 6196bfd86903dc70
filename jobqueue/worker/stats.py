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
    from jobqueue.worker.outcome import Outcomes

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
        return {
            "p50": _ms(self.quantile(0.50)),
            "p95": _ms(self.quantile(0.95)),
            "p99": _ms(self.quantile(0.99)),
            "max": _ms(self.max if self.total else None),
        }

    def since(self, earlier: list[int]) -> LatencyHistogram:
        """What was added after `earlier` (a copy of `counts`): a histogram of
        its own, whose largest value is bounded by this one's."""
        recent = LatencyHistogram()
        recent.counts = [now - then for now, then in zip(self.counts, earlier, strict=True)]
        recent.total = sum(recent.counts)
        recent.max = self.max
        return recent


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v * 1000, 3)


@dataclass(frozen=True)
class Mark:
    """The counts at one moment, to report what happened since (`WorkerStats.since`)."""

    at: float
    completed: int
    failed: int
    retried: int
    rerun: int
    latency: list[int]


@dataclass
class WorkerStats:
    """Counts since the worker became active."""

    completed: int = 0
    failed: int = 0
    retried: int = 0
    handed_back: int = 0
    rescued: int = 0
    #: Attempts that asked to run later (`Snooze`): not counted as attempts.
    snoozed: int = 0
    batches: int = 0
    #: Jobs that ran a second time because a batch-mate without a savepoint
    #: failed after writing (see `recovery.py`).
    rerun: int = 0
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
        self.snoozed += len(out.snoozed_ids)
        self.handler_time.add_many(out.handler_times)
        self.latency.add_many(latencies)

    def stop_clock(self) -> None:
        self.stopped = time.perf_counter()

    def mark(self) -> Mark:
        return Mark(time.perf_counter(), self.completed, self.failed, self.retried, self.rerun,
                    list(self.latency.counts))

    def since(self, mark: Mark) -> tuple[dict[str, Any], Mark]:
        """What happened since `mark`, as the fields of a summary line, and a
        new mark. Costs nothing per job: the histogram's counts are compared
        with the mark's copy of them."""
        now = self.mark()
        seconds = now.at - mark.at
        latency = self.latency.since(mark.latency)
        fields: dict[str, Any] = {
            "interval_s": round(seconds, 3), "completed": now.completed - mark.completed,
            "failed": now.failed - mark.failed, "retried": now.retried - mark.retried,
            "rerun": now.rerun - mark.rerun}
        finished = fields["completed"] + fields["failed"]
        fields["jobs_per_sec"] = round(finished / seconds, 1) if seconds > 0 else 0.0
        fields.update({f"latency_{k}_ms": v for k, v in latency.summary_ms().items()
                       if k != "max"})
        return fields, now

    @property
    def elapsed(self) -> float:
        if self.started is None:
            return 0.0
        return (self.stopped or time.perf_counter()) - self.started

    def report(self) -> dict[str, Any]:
        """The figures `JobRunner.run()` returns and logs.

        processed: jobs completed. failed: jobs that ended failed. retried:
        failed attempts that were scheduled again. snoozed: attempts that
        asked to run later (not counted as attempts). rerun: jobs run a second
        time because a batch-mate failed after writing without a savepoint.
        error_rate: failed attempts over all attempts. throughput: finished
        jobs per second while active. handler_ms: time inside handlers.
        latency_ms: from enqueue (or due time, for scheduled jobs and retries)
        to the completing statement.
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
            "snoozed": self.snoozed,
            "batches": self.batches,
            "rerun": self.rerun,
            "error_rate": round((self.failed + self.retried) / attempts, 4) if attempts else 0.0,
            "throughput_per_sec": (
                round((self.completed + self.failed) / elapsed, 1) if elapsed > 0 else 0.0
            ),
            "handler_ms": self.handler_time.summary_ms(),
            "latency_ms": self.latency.summary_ms(),
        }
