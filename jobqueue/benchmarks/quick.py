"""The core numbers in a minute, without Jupyter: `make bench-quick`.

The lab's own measurements at a small size, printed, and written to
`bench-results/core-<stamp>.csv`: no-op drains by one burst worker
(`scenarios.drain`), and a lone job's latency, jobs arriving one at a time
far enough apart that each finds the worker idle (`scenarios.open_loop`), so
it measures the LISTEN/NOTIFY wake-up (the "< 100 ms" target), not queueing.
A drain's enqueue-to-completion latency is shown too, but its jobs were all
queued before the worker started: it is mostly waiting, and grows with N.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import os
import statistics
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jobqueue.benchmarks.scenarios import (
    WARMUP_SECONDS,
    check_bench_name,
    close_bench,
    connected,
    drain,
    environment,
    open_bench,
    open_loop,
    quantile,
)
from jobqueue.worker import DEFAULT_BATCH_SIZE, DEFAULT_CONCURRENCY

__all__ = ["check_bench_name", "main", "quantile", "run_all"]

DEFAULT_SIZES = "100,1000,10000"
#: Lone jobs per second: 20 ms apart, ten times a lone job's latency here.
LONE_RATE = 50.0
_DRAIN_LATENCY = """
SELECT percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (
           ORDER BY extract(epoch FROM completed_at - created_at)) AS latency
FROM jobqueue_all_jobs"""
CSV_FIELDS = ("kind", "n", "run", "seconds", "jobs_per_sec", "p50_ms", "p95_ms", "p99_ms",
              "batch_size", "concurrency")


async def drain_row(url: str, n: int, batch_size: int, concurrency: int) -> dict[str, Any]:
    """One drain, with its jobs' enqueue-to-completion percentiles."""
    row = await drain(url, n=n, batch_size=batch_size, workers=1, shared=False,
                      concurrency=concurrency)
    async with connected(url) as conn:
        latency = await conn.fetchval(_DRAIN_LATENCY)
    return {**row, **{f"p{q}_ms": float(v) * 1000
                      for q, v in zip((50, 95, 99), latency, strict=True)}}


async def run_all(args: argparse.Namespace, name: str = "quick") -> dict[str, Any]:
    """Every size `repeat` times, then the lone-job latency, in a database of
    its own (`jobqueue_bench_<name>`, dropped at the end)."""
    url = await open_bench(name)
    try:
        context = await environment(url)
        runs = [{**await drain_row(url, n, args.batch_size, args.concurrency), "run": run}
                for n in args.sizes for run in range(1, args.repeat + 1)]
        lone = await open_loop(url, rate=LONE_RATE,
                               seconds=WARMUP_SECONDS + args.samples / LONE_RATE)
    finally:
        await close_bench(name)
    return {"context": context, "runs": runs, "lone": lone["summary"]}


def drain_table(runs: Sequence[dict[str, Any]]) -> str:
    """Medians over each size's runs (robust to one disturbed run), jobs/s spread."""
    lines = ["| N jobs | time (s) | jobs/s (min–max) | p50 latency (ms) | p95 latency (ms) "
             "| p99 latency (ms) |", "|---:|---:|---:|---:|---:|---:|"]
    for n in dict.fromkeys(r["n"] for r in runs):
        mine = [r for r in runs if r["n"] == n]
        med = {k: statistics.median(r[k] for r in mine)
               for k in ("seconds", "jobs_per_sec", "p50_ms", "p95_ms", "p99_ms")}
        rates = [r["jobs_per_sec"] for r in mine]
        lines.append(f"| {n:,} | {med['seconds']:.3f} | {med['jobs_per_sec']:,.0f} "
                     f"({min(rates):,.0f}–{max(rates):,.0f}) | {med['p50_ms']:,.1f} "
                     f"| {med['p95_ms']:,.1f} | {med['p99_ms']:,.1f} |")
    return "\n".join(lines)


def write_csv(path: Path, context: dict[str, str], runs: Sequence[dict[str, Any]],
              lone: dict[str, Any]) -> None:
    """Every run; machine and settings first as `# key: value` lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        f.writelines(f"# {key}: {value}\n" for key, value in context.items())
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows({"kind": "drain", **run} for run in runs)
        writer.writerows({"kind": f"lone_{to}", "n": lone["samples"], "run": 1, "concurrency": 1,
                          **{f"p{q}_ms": lone[f"{to}_p{q}_ms"] for q in (50, 95, 99)}}
                         for to in ("start", "complete"))


def parse_sizes(text: str) -> list[int]:
    sizes = [int(part.strip().replace("_", "")) for part in text.split(",") if part.strip()]
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"sizes must be positive whole numbers: {text!r}")
    return sizes


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Options; JOBQUEUE_BENCH_SIZES / JOBQUEUE_BENCH_REPEAT replace the defaults
    (so CI runs it small), an explicit flag beats both."""
    parser = argparse.ArgumentParser(
        prog="python -m jobqueue.benchmarks.quick",
        description="Drain N no-op jobs with one worker; measure lone-job latency.")
    parser.add_argument("--sizes", type=parse_sizes,
                        default=parse_sizes(os.environ.get("JOBQUEUE_BENCH_SIZES", DEFAULT_SIZES)),
                        help="comma-separated numbers of jobs (default %(default)s)")
    parser.add_argument("--repeat", type=int,
                        default=int(os.environ.get("JOBQUEUE_BENCH_REPEAT", 3)),
                        help="runs per size; the table shows their median (default %(default)s)")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE)
    parser.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY)
    parser.add_argument("--samples", type=int, default=200,
                        help="lone jobs for the latency measurement (default %(default)s)")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.samples < 1:
        parser.error("--repeat and --samples must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    results = asyncio.run(run_all(args, f"quick_{uuid.uuid4().hex[:6]}"))
    c, lone = results["context"], results["lone"]
    print(f"Machine: {c['cpu']}, {c['cores']} cores, {c['ram']} RAM\n"
          f"PostgreSQL: {c['postgres']}\nSettings: fsync={c['fsync']}, "
          f"synchronous_commit={c['synchronous_commit']}, shared_buffers={c['shared_buffers']}")
    print(f"\nDrain: one burst worker, {args.concurrency} lane(s), batch {args.batch_size}, "
          f"median of {args.repeat} run(s), timed from the first claim to the last completion "
          "(database clock). Latency is enqueue-to-completion: every job was queued before "
          "the worker started, so it is mostly waiting and grows with N.\n")
    print(drain_table(results["runs"]))
    print(f"\nLone-job latency, idle worker woken by NOTIFY ({lone['samples']} jobs, "
          f"{LONE_RATE:g}/s), p50 / p95 / p99 ms (database clock):")
    for to in ("start", "complete"):
        print(f"- enqueue to {to}: "
              + " / ".join(f"{lone[f'{to}_p{q}_ms']:.1f}" for q in (50, 95, 99)))
    path = Path("bench-results") / f"core-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.csv"
    write_csv(path, c, results["runs"], lone)
    print(f"\nRaw results: {path}")


if __name__ == "__main__":
    main()
