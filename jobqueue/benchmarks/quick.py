"""The core numbers in a minute, without Jupyter: `python -m jobqueue.benchmarks.quick`
(`make bench-quick`; `make bench` runs the notebooks instead).

Two questions, measured separately because they have different answers:

* Throughput (`drain_benchmark`): N no-op jobs already in the table, one
  burst-mode worker drains them; the clock covers the whole `JobRunner.run()`,
  start-up and shutdown included, and stops only when it returns. Every job must
  end `completed` in the database, or the benchmark fails: a queue that loses
  jobs has no throughput worth printing.
* Latency (`lone_job_latency`): an idle worker, a single job enqueued and
  committed, how long until it is `completed`. This is the "< 100 ms" target:
  it measures the LISTEN/NOTIFY wake-up path, not queueing.

Latency of the drain is also reported (enqueue-to-completion, from the database
clock), but for pre-enqueued jobs it is mostly time spent waiting in the queue,
so it grows with N; it is not the per-job cost.

Everything runs in a database of its own (`jobqueue_bench`), created and
migrated once per run and dropped at the end; the functions refuse to truncate
any other database.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import logging
import os
import statistics
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import make_url

from jobqueue import db, embedded
from jobqueue.benchmarks.handlers import noop
from jobqueue.enqueue import enqueue, enqueue_many
from jobqueue.registry import HandlerRegistry
from jobqueue.schema import migrations
from jobqueue.worker import DEFAULT_BATCH_SIZE, DEFAULT_CONCURRENCY, JobRunner

logger = logging.getLogger(__name__)

#: The benchmark's own database; it is dropped and recreated on every run.
BENCH_DATABASE = "jobqueue_bench"
#: The job type of the benchmark's no-op jobs.
NOOP = "noop"
#: Jobs per `enqueue_many` statement: one statement per chunk, one transaction.
ENQUEUE_CHUNK = 10_000
DEFAULT_SIZES = "100,1000,10000"
DEFAULT_REPEAT = 3
QUANTILES = (0.5, 0.95, 0.99)

_LATENCY_SQL = """
SELECT count(*) FILTER (WHERE status = 'completed') AS completed,
       count(*) AS total,
       percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (
           ORDER BY extract(epoch FROM completed_at - created_at))
           FILTER (WHERE status = 'completed') AS latency
FROM jobs
"""
_JOB_STATE_SQL = """
SELECT status, extract(epoch FROM completed_at - created_at) AS latency
FROM jobs WHERE id = $1
"""


# -- the database --------------------------------------------------------------


def bench_registry() -> HandlerRegistry:
    """A private registry, so the benchmark neither needs nor disturbs the
    application's handlers."""
    registry = HandlerRegistry()
    registry.add(NOOP, noop)
    return registry


async def prepare_database(url: str, name: str = BENCH_DATABASE) -> str:
    """Create the benchmark database on `url`'s server (replacing any leftover)
    and migrate it; return its URL. Once per benchmark run: measurements in
    between only truncate, so they all see the same schema and server state.

    `name` must be `jobqueue_bench` or start with `jobqueue_bench_`; tests pass
    a unique one, so they never drop the database of a `make bench` running on
    the same server (dropping it WITH (FORCE) cuts that run's connections)."""
    check_bench_name(name)
    server_url = db.database_url(url)
    bench_url = await db.create_database(server_url, name, replace=True)
    await migrations.upgrade(bench_url)
    logger.info("benchmark database ready: %s", name)
    return bench_url


async def drop_bench_database(url: str, name: str = BENCH_DATABASE) -> None:
    """Remove a benchmark database; `url` is any database on that server."""
    check_bench_name(name)
    await db.drop_database(db.database_url(url), name)


def check_bench_name(name: str | None) -> str:
    """`name`, if it is a benchmark database's; else ValueError. Benchmarks
    TRUNCATE `jobs` and drop their database: pointed at a real queue by
    mistake they would destroy it, so only their own names are accepted."""
    if not name or not (name == BENCH_DATABASE or name.startswith(BENCH_DATABASE + "_")):
        raise ValueError(
            f"the benchmark truncates `jobs`, so it only runs on database {BENCH_DATABASE!r} "
            f"or {BENCH_DATABASE + '_*'!r} (from prepare_database), not {name!r}"
        )
    return name


def _bench_url(url: str) -> str:
    """The normalised URL, after checking it names a benchmark database."""
    normalised = db.database_url(url)
    check_bench_name(make_url(normalised).database)
    return normalised


async def reset_jobs(url: str) -> None:
    """Empty the jobs table (keeps the schema: no re-migration between runs)."""
    conn = await db.connect(url, application_name="jobqueue bench")
    try:
        await conn.execute("TRUNCATE jobs")
    finally:
        await conn.close()


async def vacuum_analyze(url: str) -> None:
    """Fresh statistics and visibility map before the clock starts, so every
    run plans and scans alike. VACUUM refuses to run inside a transaction,
    hence a plain asyncpg connection in autocommit."""
    conn = await db.connect(url, application_name="jobqueue bench")
    try:
        await conn.execute("VACUUM ANALYZE jobs")
    finally:
        await conn.close()


async def enqueue_noops(url: str, n: int) -> None:
    """Put `n` no-op jobs in the queue in one transaction, via the public API."""
    engine = db.create_engine(url)
    try:
        async with engine.begin() as conn:
            for start in range(0, n, ENQUEUE_CHUNK):
                count = min(ENQUEUE_CHUNK, n - start)
                await enqueue_many(conn, NOOP, [{}] * count)
    finally:
        await engine.dispose()


async def _fetchrow(url: str, sql: str, *args: Any) -> Any:
    conn = await db.connect(url, application_name="jobqueue bench")
    try:
        return await conn.fetchrow(sql, *args)
    finally:
        await conn.close()


# -- throughput -------------------------------------------------------------------


async def drain_benchmark(
    url: str, n: int, *, batch_size: int = DEFAULT_BATCH_SIZE,
    concurrency: int = DEFAULT_CONCURRENCY
) -> dict[str, Any]:
    """Enqueue `n` no-op jobs, then time one burst worker draining them all.

    `url` is the benchmark database from `prepare_database`. Raises
    RuntimeError unless every job ends `completed`. Latencies are
    enqueue-to-completion from the database clock: for pre-enqueued jobs that
    is mostly queueing, and grows with `n`.
    """
    if n < 1:
        raise ValueError("n must be at least 1")
    url = _bench_url(url)
    await reset_jobs(url)
    await enqueue_noops(url, n)
    await vacuum_analyze(url)

    runner = JobRunner(url, registry=bench_registry(), burst=True, batch_size=batch_size,
                       concurrency=concurrency, install_signal_handlers=False)
    started = time.perf_counter()
    report = await runner.run()
    seconds = time.perf_counter() - started
    logger.debug("runner report: %s", report)

    row = await _fetchrow(url, _LATENCY_SQL)
    if row["completed"] != n or row["total"] != n:
        raise RuntimeError(
            f"benchmark lost jobs: {row['completed']} of {n} completed "
            f"({row['total']} rows in jobs); the runner reported {report.get('completed')}"
        )
    p50, p95, p99 = (float(v) * 1000 for v in row["latency"])
    return {"n": n, "seconds": seconds, "jobs_per_sec": n / seconds,
            # The worker's own figure: from taking the lock to stopping, without
            # connecting (tens of ms, which dominate at n = 100).
            "active_jobs_per_sec": report["throughput_per_sec"],
            "p50_ms": p50, "p95_ms": p95, "p99_ms": p99,
            "batch_size": batch_size, "concurrency": concurrency}


# -- latency of a lone job -----------------------------------------------------------


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile with linear interpolation: the same definition as
    PostgreSQL's percentile_cont, so client and database figures compare."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def percentiles(values: Sequence[float]) -> tuple[float, float, float]:
    """p50, p95, p99 (see `quantile`)."""
    return quantile(values, 0.5), quantile(values, 0.95), quantile(values, 0.99)


async def _wait_completed(
    conn: Any, job_id: uuid.UUID, runner_task: asyncio.Task[Any], timeout: float
) -> float:
    """Poll the job's row every millisecond until it is completed; return its
    database latency (seconds). Fails fast if the worker died."""
    deadline = time.monotonic() + timeout
    while True:
        row = await conn.fetchrow(_JOB_STATE_SQL, job_id)
        if row["status"] == "completed":
            return float(row["latency"])
        if row["status"] == "failed":
            raise RuntimeError(f"benchmark job {job_id} failed")
        if runner_task.done():
            runner_task.result()  # re-raise the worker's error, if it had one
            raise RuntimeError("the worker stopped during the latency benchmark")
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} not completed within {timeout:g}s")
        await asyncio.sleep(0.001)


async def _one_lone_job(
    engine: Any, conn: Any, runner_task: asyncio.Task[Any], timeout: float
) -> tuple[float, float]:
    """Enqueue one job in its own transaction; (database, client) latency in s.

    The client clock starts just after the commit returns and stops when the
    poll sees `completed`, so it includes up to ~1 ms of polling granularity."""
    async with engine.begin() as tx:
        job_id = await enqueue(tx, NOOP, {})
    committed = time.perf_counter()
    db_latency = await _wait_completed(conn, job_id, runner_task, timeout)
    return db_latency, time.perf_counter() - committed


async def lone_job_latency(
    url: str, samples: int = 200, *, gap: float = 0.01, timeout: float = 10.0
) -> dict[str, Any]:
    """Latency of single jobs reaching an idle worker, `samples` times.

    The worker is not in burst mode and polls only every second, so a latency
    well under a second shows LISTEN/NOTIFY woke it. A warm-up job (not
    counted) gets its connections open first; `gap` seconds between samples let
    the worker go back to waiting, so each sample is a wake-up, not a hot loop.
    """
    if samples < 1:
        raise ValueError("samples must be at least 1")
    url = _bench_url(url)
    await reset_jobs(url)
    await vacuum_analyze(url)
    runner = JobRunner(url, registry=bench_registry(), poll_interval=1.0,
                       install_signal_handlers=False)
    task = asyncio.create_task(runner.run())
    engine = db.create_engine(url)
    conn = await db.connect(url, application_name="jobqueue bench poll")
    db_times: list[float] = []
    client_times: list[float] = []
    try:
        await asyncio.wait_for(runner.wait_active(), timeout)
        await _one_lone_job(engine, conn, task, timeout)  # warm-up
        for _ in range(samples):
            await asyncio.sleep(gap)
            db_latency, client_latency = await _one_lone_job(engine, conn, task, timeout)
            db_times.append(db_latency)
            client_times.append(client_latency)
    finally:
        runner.stop()
        await asyncio.wait_for(task, timeout)
        await conn.close()
        await engine.dispose()
    db_p = percentiles(db_times)
    client_p = percentiles(client_times)
    return {
        "samples": samples,
        **{f"db_p{q}_ms": v * 1000 for q, v in zip((50, 95, 99), db_p, strict=True)},
        **{f"client_p{q}_ms": v * 1000 for q, v in zip((50, 95, 99), client_p, strict=True)},
    }


# -- the environment -----------------------------------------------------------------


def machine_info() -> dict[str, str]:
    """CPU model, cores and RAM: numbers mean little without the machine."""
    info = {"cpu": "unknown", "cores": str(os.cpu_count() or "?"), "ram": "unknown"}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                info["ram"] = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
                break
    except OSError:
        logger.info("no /proc: machine details unknown")
    return info


async def server_info(url: str) -> dict[str, str]:
    """PostgreSQL's version and the settings that move the numbers most:
    durability (fsync, synchronous_commit) and the buffer cache."""
    row = await _fetchrow(
        url,
        "SELECT version(), current_setting('fsync') AS fsync, "
        "current_setting('synchronous_commit') AS synchronous_commit, "
        "current_setting('shared_buffers') AS shared_buffers",
    )
    return {"postgres": row["version"], "fsync": row["fsync"],
            "synchronous_commit": row["synchronous_commit"],
            "shared_buffers": row["shared_buffers"]}


# -- the report ------------------------------------------------------------------


def summarize(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Medians over repeats (robust to one disturbed run), plus the jobs/s spread."""
    rates = [r["jobs_per_sec"] for r in runs]
    out = {key: statistics.median(r[key] for r in runs)
           for key in ("seconds", "jobs_per_sec", "active_jobs_per_sec",
                       "p50_ms", "p95_ms", "p99_ms")}
    return {"n": runs[0]["n"], **out, "rate_min": min(rates), "rate_max": max(rates),
            "repeat": len(runs)}


def drain_table(summaries: Sequence[dict[str, Any]]) -> str:
    """The Markdown table of the drain runs."""
    lines = [
        "| N jobs | time (s) | jobs/s (min–max) | jobs/s once active | p50 latency (ms) "
        "| p95 latency (ms) | p99 latency (ms) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summaries:
        lines.append(
            f"| {s['n']:,} | {s['seconds']:.3f} | {s['jobs_per_sec']:,.0f} "
            f"({s['rate_min']:,.0f}–{s['rate_max']:,.0f}) | {s['active_jobs_per_sec']:,.0f} "
            f"| {s['p50_ms']:,.1f} "
            f"| {s['p95_ms']:,.1f} | {s['p99_ms']:,.1f} |"
        )
    return "\n".join(lines)


def lone_lines(result: dict[str, Any]) -> str:
    """The lone-job latency, from the database clock and from the client."""
    def triple(prefix: str) -> str:
        return " / ".join(f"{result[f'{prefix}_p{q}_ms']:.1f}" for q in (50, 95, 99))

    return (
        f"Lone-job latency, idle worker woken by NOTIFY ({result['samples']} samples), "
        f"p50 / p95 / p99 ms:\n"
        f"- database clock (completed_at - created_at): {triple('db')}\n"
        f"- client (after enqueue commit -> completion seen, ~1 ms polling): "
        f"{triple('client')}"
    )


def header(context: dict[str, str]) -> str:
    """Where the numbers come from: machine, server version, durability settings."""
    return (
        f"Machine: {context['cpu']}, {context['cores']} cores, {context['ram']} RAM\n"
        f"PostgreSQL: {context['postgres']}\n"
        f"Settings: fsync={context['fsync']}, "
        f"synchronous_commit={context['synchronous_commit']}, "
        f"shared_buffers={context['shared_buffers']}"
    )


def results_dir() -> Path:
    """`bench-results/` at the checkout's root (git-ignored), else in the cwd."""
    checkout = Path(__file__).resolve().parents[2]
    base = checkout if (checkout / "alembic.ini").exists() else Path.cwd()
    return base / "bench-results"


CSV_FIELDS = ("kind", "n", "run", "seconds", "jobs_per_sec", "active_jobs_per_sec",
              "p50_ms", "p95_ms", "p99_ms", "batch_size", "concurrency")


def write_csv(path: Path, context: dict[str, str], drains: Sequence[dict[str, Any]],
              lone: dict[str, Any]) -> None:
    """Raw per-run results; machine and settings as leading `#` comment lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        for key, value in context.items():
            f.write(f"# {key}: {value}\n")
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for run in drains:
            writer.writerow({"kind": "drain", **run})
        for clock in ("db", "client"):
            writer.writerow({"kind": f"lone_{clock}", "n": lone["samples"], "run": 1,
                             **{f"p{q}_ms": lone[f"{clock}_p{q}_ms"] for q in (50, 95, 99)},
                             "concurrency": 1})


# -- the command -----------------------------------------------------------------


def parse_sizes(text: str) -> list[int]:
    sizes = [int(part.strip().replace("_", "")) for part in text.split(",") if part.strip()]
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"sizes must be positive whole numbers: {text!r}")
    return sizes


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Options; JOBQUEUE_BENCH_SIZES / JOBQUEUE_BENCH_REPEAT replace the defaults
    (so CI runs `make bench` small), an explicit flag beats both."""
    parser = argparse.ArgumentParser(
        prog="python -m jobqueue.benchmarks.quick",
        description="Drain N no-op jobs with one worker; measure lone-job latency.")
    parser.add_argument("--sizes", type=parse_sizes,
                        default=parse_sizes(os.environ.get("JOBQUEUE_BENCH_SIZES", DEFAULT_SIZES)),
                        help="comma-separated numbers of jobs (default %(default)s)")
    parser.add_argument("--repeat", type=int,
                        default=int(os.environ.get("JOBQUEUE_BENCH_REPEAT", DEFAULT_REPEAT)),
                        help="runs per size; the table shows their median (default %(default)s)")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE)
    parser.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY)
    parser.add_argument("--samples", type=int, default=200,
                        help="lone jobs for the latency measurement (default %(default)s)")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.samples < 1:
        parser.error("--repeat and --samples must be at least 1")
    return args


async def run_all(args: argparse.Namespace) -> dict[str, Any]:
    """Prepare once, measure every size `repeat` times and the lone-job latency,
    drop the benchmark database; return everything `main` prints and saves."""
    server_url = embedded.database_url()
    bench_url = await prepare_database(server_url)
    try:
        context = {**machine_info(), **(await server_info(bench_url))}
        runs: list[dict[str, Any]] = []
        summaries = []
        for n in args.sizes:
            per_size = []
            for run in range(1, args.repeat + 1):
                result = await drain_benchmark(bench_url, n, batch_size=args.batch_size,
                                               concurrency=args.concurrency)
                logger.info("n=%d run %d: %.0f jobs/s", n, run, result["jobs_per_sec"])
                per_size.append({**result, "run": run})
            runs.extend(per_size)
            summaries.append(summarize(per_size))
        lone = await lone_job_latency(bench_url, args.samples)
    finally:
        await drop_bench_database(server_url)
    return {"context": context, "runs": runs, "summaries": summaries, "lone": lone}


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m jobqueue.benchmarks.quick`: the table of `make bench-quick`, and a CSV
    of every run."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    results = asyncio.run(run_all(args))
    print(header(results["context"]))
    print(f"\nDrain: {args.concurrency} worker lane(s), batch size {args.batch_size}, "
          f"median of {args.repeat} run(s) (jobs/s: min–max in brackets). Latency is "
          "enqueue-to-completion (database clock): every job was enqueued before the worker "
          "started, so it is mostly time waiting in the queue and grows with N.\n")
    print(drain_table(results["summaries"]))
    print()
    print(lone_lines(results["lone"]))
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = results_dir() / f"core-{stamp}.csv"
    write_csv(path, results["context"], results["runs"], results["lone"])
    print(f"\nRaw results: {path}")


if __name__ == "__main__":
    main()
