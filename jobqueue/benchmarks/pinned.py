"""The pinned-horizon check: `make bench-pinned` before a change to the
claims or the chores lands.

jobqueue alone, one worker as the README starts it, 500 jobs/s arriving one
by one: a baseline, then one session idle in a transaction that holds an
xid for 120 s (`pressure.PINNED_PHASES`). Passes when p50 and p99 of the
jobs enqueued in the hold's last 40 s are within `pressure.GOAL` (1.5×) of
the baseline's (`pressure.goal_rows`); exits 1 otherwise. Issue 49 is why:
twice a change to the claims let every claim step over the dead entries of
the jobs finished since the pin, and latency climbed ×13 in two minutes,
unseen, because nothing ran this before the change landed.

    python -m jobqueue.benchmarks.pinned [--rate 500] [--hold 120] [--baseline 50]

It runs for about four minutes and wants a quiet machine: other load moves
the baseline and the hold alike, but not by the same amount.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import Any

from jobqueue.benchmarks import pressure

logger = logging.getLogger(__name__)

SYSTEM = "jobqueue"


def config(rate: float, hold: float, baseline: float) -> pressure.Config:
    """`PINNED_PHASES` with the hold and baseline given, at `rate` jobs/s:
    what the worker sustains is not measured (a drain would take longer
    than the check), but given as `rate` ÷ `base_share`, so the phases run
    at exactly `rate`."""
    seconds = {"baseline": baseline, "holder": hold}
    phases = [{**p, "seconds": seconds.get(p["name"], p["seconds"])}
              for p in pressure.PINNED_PHASES]
    return pressure.Config(phases=pressure.phases(phases), rate=rate,
                           sustained={SYSTEM: rate / pressure.Config.base_share})


async def check(conf: pressure.Config, prefix: str = "pinned") -> list[dict[str, Any]]:
    """One run in a database of its own (`jobqueue_bench_<prefix>`): `goal_rows`."""
    urls = await pressure.open_databases([SYSTEM], prefix)
    try:
        result = await pressure.run(SYSTEM, urls[SYSTEM], {"flags": []}, conf)
    finally:
        await pressure.close_databases([SYSTEM], prefix)
    return pressure.goal_rows(result["rows"])


def verdict(rows: list[dict[str, Any]]) -> str:
    """The goal's lines, as the terminal shows them."""
    lines = []
    for r in rows:
        lines.append(
            f"{r['system']}: {r['late_jobs']} jobs in the last seconds of a "
            f"{r['seconds']:.0f} s hold; p50 {r['baseline_p50_ms']:.2f} -> "
            f"{r['late_p50_ms']:.2f} ms (x{r['p50_ratio']:.2f}), p99 "
            f"{r['baseline_p99_ms']:.2f} -> {r['late_p99_ms']:.2f} ms (x{r['p99_ratio']:.2f}); "
            f"goal x{r['goal']}: {'met' if r['met'] else 'MISSED'}")
    return "\n".join(lines) or "no phase held by the holder alone: nothing to judge"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=500.0, help="jobs/s (default 500)")
    parser.add_argument("--hold", type=float, default=120.0,
                        help="seconds the horizon is pinned (default 120)")
    parser.add_argument("--baseline", type=float, default=50.0,
                        help="seconds before the pin (default 50)")
    args = parser.parse_args(argv)
    if min(args.rate, args.hold, args.baseline) <= 0:
        parser.error("--rate, --hold and --baseline must be positive")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    rows = asyncio.run(check(config(args.rate, args.hold, args.baseline)))
    print(verdict(rows))
    return 0 if rows and all(r["met"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
