"""Dead-worker recovery, measured: `python -m jobqueue.benchmarks.recovery`.

A trial: an active worker and a standby (real processes) work through a
stream of short jobs; the active one receives SIGKILL (a crash) or SIGSTOP (a
hang: its connections stay open). The recovery time is from the signal to the
first job the standby completes, both read on the database's clock. After a
crash, PostgreSQL sees the connection close at once and the standby's blocked
`pg_advisory_lock` returns; after a hang, nothing happens until the worker's
heartbeat is older than the lease and a standby fences it off.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import logging
import os
import signal
import statistics
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jobqueue import db, embedded
from jobqueue.benchmarks.quick import (
    drop_bench_database,
    header,
    machine_info,
    prepare_database,
    results_dir,
    server_info,
)
from jobqueue.testing import WorkerProcess, in_state, wait_for, worker_state

logger = logging.getLogger(__name__)

RECOVERY_DATABASE = "jobqueue_bench_recovery"
SIGNALS = {"SIGKILL": signal.SIGKILL, "SIGSTOP": signal.SIGSTOP}


async def recovery_trial(
    url: str,
    sig: signal.Signals,
    *,
    lease: float = 5.0,
    jobs: int = 3000,
    job_seconds: float = 0.005,
    batch_size: int = 10,
    log_dir: Path | None = None,
    keep_timeline: bool = False,
) -> dict[str, Any]:
    """One crash (or hang) of the active worker under load; seconds to recover.

    keep_timeline: also return completions per 100 ms by worker ("first" was
    active, "second" stood by) from 1 s before the signal to 1 s after the
    standby's first completion."""
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="jobqueue-recovery-"))
    args = ("--import", "jobqueue.benchmarks.handlers", "--batch-size", str(batch_size),
            "--lease", str(lease), "--log-level", "WARNING")
    conn = await db.connect(url, application_name="jobqueue recovery")
    workers: list[WorkerProcess] = []
    try:
        await conn.execute("TRUNCATE jobs; DELETE FROM jobqueue_workers")
        active = WorkerProcess(url, log_dir / "active.log", *args)
        workers.append(active)
        await wait_for(lambda: in_state(conn, active, "active"), timeout=30,
                       message="the first worker to be active")
        standby = WorkerProcess(url, log_dir / "standby.log", *args)
        workers.append(standby)
        await wait_for(lambda: in_state(conn, standby, "standby"), timeout=30,
                       message="the second worker to stand by")
        standby_id = (await worker_state(conn, standby))["id"]  # type: ignore[index]
        await conn.execute(
            "INSERT INTO jobs (job_type, payload) SELECT 'sleep', jsonb_build_object("
            "'seconds', $1::float8) FROM generate_series(1, $2)", job_seconds, jobs)
        await wait_for(
            lambda: conn.fetchval("SELECT count(*) >= 20 FROM jobs WHERE status = 'completed'"),
            timeout=30, message="work under way")

        os.kill(active.pid, sig)
        signalled = await conn.fetchval("SELECT clock_timestamp()")
        first = await wait_for(
            lambda: conn.fetchval(
                "SELECT min(completed_at) FROM jobs WHERE worker_id = $1 AND completed_at > $2",
                standby_id, signalled),
            timeout=lease + 30, interval=0.01, message="the standby's first completion")
        in_flight = await conn.fetchval(
            "SELECT count(*) FROM jobs WHERE status = 'processing' AND worker_id <> $1",
            standby_id)
        result: dict[str, Any] = {
            "signal": sig.name, "seconds": (first - signalled).total_seconds(),
            "lease": lease, "batch_size": batch_size, "left_processing": in_flight}
        if keep_timeline:
            await wait_for(lambda: conn.fetchval(
                "SELECT clock_timestamp() > $1::timestamptz + interval '1 second'", first),
                timeout=10, interval=0.05, message="a second of work after recovery")
            rows = await conn.fetch(
                "SELECT CASE WHEN worker_id = $1 THEN 'second' ELSE 'first' END AS worker,"
                " CAST(floor(extract(epoch FROM completed_at - $2) * 10) / 10 AS float8) AS t,"
                " count(*) AS jobs FROM jobs"
                " WHERE completed_at BETWEEN $2::timestamptz - interval '1 second'"
                " AND $3::timestamptz + interval '1 second'"
                " GROUP BY 1, 2 ORDER BY 2, 1", standby_id, signalled, first)
            result["timeline"] = [dict(r) for r in rows]
        return result
    finally:
        for w in workers:
            w.close()
        await conn.close()


async def measure_recovery(url: str, sig: signal.Signals, trials: int, **options: Any
                           ) -> list[dict[str, Any]]:
    """`trials` independent trials; `url` must name a benchmark database."""
    results = []
    for n in range(trials):
        result = await recovery_trial(url, sig, **options)
        logger.info("%s trial %d: %.3fs", sig.name, n + 1, result["seconds"])
        results.append({"trial": n + 1, **result})
    return results


def summary_table(results: Sequence[dict[str, Any]]) -> str:
    lines = ["| signal | trials | median (s) | min (s) | max (s) | lease (s) |",
             "|---|---:|---:|---:|---:|---:|"]
    for name in SIGNALS:
        seconds = [r["seconds"] for r in results if r["signal"] == name]
        if seconds:
            lease = next(r["lease"] for r in results if r["signal"] == name)
            lines.append(f"| {name} | {len(seconds)} | {statistics.median(seconds):.3f} "
                         f"| {min(seconds):.3f} | {max(seconds):.3f} | {lease:g} |")
    return "\n".join(lines)


async def run(trials: int, signals: Sequence[str], lease: float) -> list[dict[str, Any]]:
    url = await prepare_database(embedded.database_url(), RECOVERY_DATABASE)
    try:
        context = {**machine_info(), **await server_info(url)}
        results: list[dict[str, Any]] = []
        for name in signals:
            results += await measure_recovery(url, SIGNALS[name], trials, lease=lease)
    finally:
        await drop_bench_database(url, RECOVERY_DATABASE)
    path = results_dir() / f"recovery-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        for key, value in context.items():
            f.write(f"# {key}: {value}\n")
        writer = csv.DictWriter(f, fieldnames=list(results[0]))
        writer.writeheader()
        writer.writerows(results)
    print(header(context))
    print(f"\nRecovery: signal to the standby's first completed job (database clock), "
          f"{trials} trial(s) each\n")
    print(summary_table(results))
    print(f"\nRaw results: {path}")
    return results


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m jobqueue.benchmarks.recovery", description=__doc__)
    p.add_argument("--trials", type=int, default=int(os.environ.get("JOBQUEUE_BENCH_TRIALS", 10)))
    p.add_argument("--signals", default="SIGKILL,SIGSTOP")
    p.add_argument("--lease", type=float, default=5.0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    signals = [s.strip().upper() for s in args.signals.split(",") if s.strip()]
    unknown = set(signals) - set(SIGNALS)
    if unknown:
        p.error(f"unknown signal(s): {', '.join(sorted(unknown))}")
    asyncio.run(run(args.trials, signals, args.lease))


if __name__ == "__main__":
    main()
