"""Resident memory of worker processes (VmRSS in `/proc/<pid>/status`,
Linux only): a worker that leaks a few bytes per job is fine in a test and
dead after a week. Sampled from outside, it costs the worker nothing and
reads every system alike; samples carry the wall clock, placed against the
drain window the database recorded (the embedded server shares the clock).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

MIB = 1024 * 1024
INTERVAL = 0.25
#: The first gap between samples; each next one doubles, up to INTERVAL.
FIRST_INTERVAL = 0.01
#: `WorkerProcess(command=("-c", EXEC))` runs its arguments as a program in
#: the same pid (`python -c` exec's it), so signals, kill and the sampler all
#: reach that program itself (a peer's node or its own Python), not a wrapper.
EXEC = "import os, sys; os.execvp(sys.argv[1], sys.argv[1:])"


def rss_bytes(pid: int) -> int | None:
    """The process's resident set size in bytes, or None once it is gone
    (or on a system without /proc)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024  # the kernel reports kB
    return None  # a zombie has no VmRSS line


class RssSampler:
    """Samples the RSS of `pids` in a background task, as long as it runs
    (`async with`): `samples`, [{"t": epoch seconds, "pid": …, "rss_mib": …}]."""

    def __init__(self, pids: Iterable[int], interval: float = INTERVAL) -> None:
        self.pids = list(pids)
        self.interval = interval
        self.samples: list[dict[str, Any]] = []
        self._task: asyncio.Task[None] | None = None

    def sample(self) -> None:
        now = time.time()
        for pid in self.pids:
            rss = rss_bytes(pid)
            if rss is not None:
                self.samples.append({"t": now, "pid": pid, "rss_mib": rss / MIB})

    async def _run(self) -> None:
        # Densely at first, then every `interval`: a process that lives less
        # than one interval (a fast worker's drain of a few hundred jobs,
        # node's start-up included) would otherwise be read only at its spawn,
        # before its program has loaded, and report that as its peak.
        delay = min(FIRST_INTERVAL, self.interval)
        while True:
            self.sample()
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.interval)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def __aenter__(self) -> RssSampler:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


def summary(samples: Sequence[dict[str, Any]], start: float | None = None,
            end: float | None = None) -> dict[str, float]:
    """RSS (MiB) at the first and last samples inside the window [start, end]
    (the drain as the database timed it; NaN if it holds none, rather than a
    reading taken while Python was still importing) and the peak over every
    sample; with several processes, the largest of any one: the question is
    how big a worker gets."""
    nan = float("nan")
    by_pid: dict[int, list[dict[str, Any]]] = {}
    for s in samples:
        by_pid.setdefault(s["pid"], []).append(s)
    starts, peaks, ends = [], [], []
    for series in by_pid.values():
        series = sorted(series, key=lambda s: s["t"])
        inside = [s for s in series
                  if (start is None or s["t"] >= start) and (end is None or s["t"] <= end)]
        if inside:
            starts.append(inside[0]["rss_mib"])
            ends.append(inside[-1]["rss_mib"])
        peaks.append(max(s["rss_mib"] for s in series))
    return {"rss_start_mib": max(starts, default=nan), "rss_peak_mib": max(peaks, default=nan),
            "rss_end_mib": max(ends, default=nan)}


def timeline(samples: Sequence[dict[str, Any]], origin: float) -> list[dict[str, Any]]:
    """Samples with `t` in seconds from `origin` (the drain's first claim)."""
    return [{"t": s["t"] - origin, "pid": s["pid"], "rss_mib": s["rss_mib"]}
            for s in sorted(samples, key=lambda s: s["t"])]
