"""The three measurements of the benchmark lab.

- `drain`: N jobs already in the table, W worker processes (exclusive or
  shared mode), batch size B; how fast the table empties. Timed on the
  database's clock from the first claim to the last completion, so process
  start-up (a second of Python imports) is not counted.
- `open_loop`: jobs arrive one by one at a fixed rate, each in its own
  transaction, on a schedule that does not wait for the queue (open loop);
  an idle worker process picks them up. Distributions of enqueue-to-start
  and enqueue-to-completion.
- `recovery`: the active worker is killed (SIGKILL) or frozen (SIGSTOP) under
  load; the time until the standby completes a job, and the timeline of
  completions around it (see also `jobqueue.recovery`).
- `memory_timeline`: one worker drains a big table while its resident memory
  is sampled from outside (`rss`); `drain(..., memory=True)` adds the same
  figures to any drain.

The peer queues of the comparison notebook run through the same machinery in
`jobqueue.benchmarks.peers`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import statistics
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import asyncpg

from jobqueue import db
from jobqueue.bench import (
    drop_bench_database,
    machine_info,
    prepare_database,
    quantile,
    server_info,
)
from jobqueue.bench_handlers import BENCH_TABLE
from jobqueue.benchmarks import rss
from jobqueue.recovery import recovery_trial
from jobqueue.testing import WorkerProcess, wait_for
from jobqueue.worker import DEFAULT_BATCH_SIZE

logger = logging.getLogger(__name__)

LAB_DATABASE_PREFIX = "jobqueue_bench_"
HANDLERS = {"noop": {}, "write_row": {}, "sleep_10ms": {"seconds": 0.01}}
QUANTILES = (0.5, 0.95, 0.99, 0.999)


async def open_bench(name: str) -> str:
    """A migrated database of this benchmark's own (`jobqueue_bench_<name>`),
    replacing any leftover; its URL. Pair with `close_bench(name)`."""
    url = await prepare_database(db.database_url(), f"{LAB_DATABASE_PREFIX}{name}")
    conn = await db.connect(url)
    try:
        await conn.execute(BENCH_TABLE)
    finally:
        await conn.close()
    return url


async def close_bench(name: str) -> None:
    await drop_bench_database(db.database_url(), f"{LAB_DATABASE_PREFIX}{name}")


@contextlib.asynccontextmanager
async def bench_database(name: str) -> AsyncIterator[str]:
    """`open_bench` and `close_bench` as a context manager."""
    url = await open_bench(name)
    try:
        yield url
    finally:
        await close_bench(name)


async def environment(url: str) -> dict[str, str]:
    """Machine and server facts every results file carries."""
    return {**machine_info(), **await server_info(url)}


async def _reset(conn: asyncpg.Connection) -> None:
    await conn.execute("TRUNCATE jobs, jobqueue_workers, bench_rows")


async def fill(conn: asyncpg.Connection, n: int, handler: str = "noop") -> None:
    """n jobs in one server-side statement (a plain INSERT is a valid job),
    then VACUUM ANALYZE so every run starts from the same table state."""
    job_type, payload = _job(handler)
    await conn.execute(
        "INSERT INTO jobs (job_type, payload) SELECT $1, $2::jsonb FROM generate_series(1, $3)",
        job_type, payload, n)
    await conn.execute("VACUUM ANALYZE jobs")


def _job(handler: str) -> tuple[str, str]:
    import json

    if handler not in HANDLERS:
        raise ValueError(f"unknown benchmark handler {handler!r}; one of {sorted(HANDLERS)}")
    job_type = "sleep" if handler.startswith("sleep") else handler
    return job_type, json.dumps(HANDLERS[handler])


def _worker_args(batch_size: int, shared: bool, concurrency: int, *extra: str) -> list[str]:
    args = ["--import", "jobqueue.bench_handlers", "--batch-size", str(batch_size),
            "--concurrency", str(concurrency), "--log-level", "WARNING", *extra]
    return args + (["--shared"] if shared else [])


#: What a drain costs the server beyond CPU: WAL written, full-page images
#: (a page's first change after a checkpoint is logged whole) and checkpoints,
#: server-wide (pg_stat_wal, pg_stat_bgwriter; nothing else runs meanwhile).
_WAL = ("SELECT w.wal_bytes / 1048576.0 AS wal_mib, w.wal_fpi AS full_page_images,"
        " b.checkpoints_timed + b.checkpoints_req AS checkpoints"
        " FROM pg_stat_wal AS w, pg_stat_bgwriter AS b")
_WAL_COLUMNS = ("wal_mib", "full_page_images", "checkpoints")


async def drain(url: str, *, n: int, batch_size: int, workers: int, shared: bool,
                handler: str = "noop", concurrency: int = 1, timeout: float = 900.0,
                log_dir: Path | None = None, memory: bool = False) -> dict[str, Any]:
    """One drain: fill the table, start `workers` burst-mode processes, wait
    for them to exit, and read the result from the jobs table. With `memory`,
    each process's resident memory is sampled too (`rss_start_mib`,
    `rss_peak_mib`, `rss_end_mib`: see `rss.summary`)."""
    row, _ = await _drain(url, n=n, batch_size=batch_size, workers=workers, shared=shared,
                          handler=handler, concurrency=concurrency, timeout=timeout,
                          log_dir=log_dir, memory=memory)
    return row


async def _drain(url: str, *, n: int, batch_size: int, workers: int, shared: bool,
                 handler: str, concurrency: int, timeout: float, log_dir: Path | None,
                 memory: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """`drain`, plus the RSS samples (empty unless `memory`)."""
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="jobqueue-drain-"))
    conn = await db.connect(url, application_name="jobqueue bench")
    procs: list[WorkerProcess] = []
    sampler = rss.RssSampler([])
    try:
        await _reset(conn)
        await fill(conn, n, handler)
        args = _worker_args(batch_size, shared, concurrency, "--burst")
        wal_before = await conn.fetchrow(_WAL)
        procs = [WorkerProcess(url, log_dir / f"drain-{i}.log", *args) for i in range(workers)]
        if memory:
            sampler = rss.RssSampler(p.pid for p in procs)
            sampler.start()
        for p in procs:
            await p.finish(timeout)
        await sampler.stop()
        row = await conn.fetchrow(
            "SELECT count(*) FILTER (WHERE status = 'completed') AS completed, count(*) AS total,"
            " extract(epoch FROM max(completed_at) - min(started_at)) AS seconds,"
            " extract(epoch FROM min(started_at)) AS first, "
            " extract(epoch FROM max(completed_at)) AS last,"
            " count(DISTINCT worker_id) AS workers_used FROM jobs")
        stats = await conn.fetchrow(
            "SELECT n_dead_tup, n_live_tup FROM pg_stat_user_tables WHERE relname = 'jobs'")
        wal_after = await conn.fetchrow(_WAL)
    finally:
        await sampler.stop()
        for p in procs:
            p.close()
        await conn.close()
    if row["completed"] != n or row["total"] != n:
        raise RuntimeError(f"lost jobs: {row['completed']} of {n} completed")
    seconds = float(row["seconds"])
    result = {"n": n, "batch_size": batch_size, "workers": workers,
              "mode": "shared" if shared else "exclusive", "handler": handler,
              "concurrency": concurrency, "seconds": seconds, "jobs_per_sec": n / seconds,
              "workers_used": row["workers_used"], "dead_tuples": stats["n_dead_tup"],
              **{key: wal_after[key] - wal_before[key] for key in _WAL_COLUMNS}}
    result["wal_mib"] = float(result["wal_mib"])
    if not memory:
        return result, []
    first, last = float(row["first"]), float(row["last"])
    result.update(rss.summary(sampler.samples, first, last))
    return result, rss.timeline(sampler.samples, first)


async def memory_timeline(url: str, *, n: int, batch_size: int = DEFAULT_BATCH_SIZE,
                          shared: bool = False,
                          workers: int = 1, timeout: float = 3600.0) -> dict[str, Any]:
    """One drain of `n` jobs with the workers' resident memory sampled every
    quarter second: the summary row (`drain`'s, with the RSS figures) and the
    timeline (`t` in seconds from the first claim, `rss_mib`). A worker that
    kept something per job would show a line that climbs with the drain."""
    row, timeline = await _drain(url, n=n, batch_size=batch_size, workers=workers,
                                 shared=shared, handler="noop", concurrency=1, timeout=timeout,
                                 log_dir=None, memory=True)
    return {"summary": row, "timeline": timeline}


@contextlib.asynccontextmanager
async def _one_worker_and_producers(url: str, log_path: Path, connections: int,
                                    *worker_args: str
                                    ) -> AsyncIterator[tuple[asyncpg.Connection, asyncpg.Pool,
                                                             WorkerProcess]]:
    """An emptied, vacuumed table, one worker process that is active and idle,
    a pool for the producer and a connection for the measurements; the worker
    is stopped with SIGTERM on the way out."""
    conn = await db.connect(url, application_name="jobqueue bench")
    pool = await asyncpg.create_pool(**db.asyncpg_connect_args(url), min_size=connections,
                                     max_size=connections)
    worker = None
    try:
        await _reset(conn)
        await conn.execute("VACUUM ANALYZE jobs")
        worker = WorkerProcess(url, log_path, *worker_args)
        await wait_for(lambda: conn.fetchval(
            "SELECT count(*) = 1 FROM jobqueue_workers WHERE state = 'active'"),
            timeout=60, message="an active worker")
        yield conn, pool, worker
    finally:
        if worker is not None:
            await worker.stop()
        await pool.close()
        await conn.close()


async def open_loop(url: str, *, rate: float, seconds: float,
                    batch_size: int = DEFAULT_BATCH_SIZE,
                    connections: int = 8, log_dir: Path | None = None) -> dict[str, Any]:
    """Arrivals at `rate` jobs/s for `seconds`, each enqueued in its own
    transaction at its scheduled time whatever the queue is doing; one idle
    worker process. Returns the summary and the per-job latencies."""
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="jobqueue-latency-"))
    async with _one_worker_and_producers(url, log_dir / "worker.log", connections,
                                         *_worker_args(batch_size, False, 1)) as (conn, pool, _):
        total = max(1, round(rate * seconds))
        lateness = await _arrivals(pool, rate, total)
        await wait_for(lambda: conn.fetchval(
            "SELECT count(*) = $1 FROM jobs WHERE status = 'completed'", total),
            timeout=seconds + 120, interval=0.05, message="every job completed")
        rows = await conn.fetch(
            "SELECT extract(epoch FROM started_at - created_at) AS to_start,"
            " extract(epoch FROM completed_at - created_at) AS to_complete,"
            " extract(epoch FROM created_at) AS created FROM jobs")
    created = sorted(float(r["created"]) for r in rows)
    span = created[-1] - created[0] if len(created) > 1 else 0.0
    to_start = [float(r["to_start"]) for r in rows]
    to_complete = [float(r["to_complete"]) for r in rows]
    return latency_result(rate, seconds, span, lateness, to_start, to_complete)


async def soak(url: str, *, rate: float, seconds: float, keep_seconds: float,
               interval: float = 1.0, connections: int = 8,
               log_dir: Path | None = None) -> dict[str, Any]:
    """A long steady run: arrivals at `rate` for `seconds` on one worker (its
    defaults) that prunes completed jobs older than `keep_seconds`. Every
    `interval` seconds: the jobs table's live and dead rows, its size and its
    pickable index's, the backlog, autovacuum runs so far and the worker's
    resident memory. A healthy queue draws flat or saw-toothed lines; none
    may climb with time."""
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="jobqueue-soak-"))
    timeline: list[dict[str, Any]] = []
    async with _one_worker_and_producers(
            url, log_dir / "worker.log", connections, "--import", "jobqueue.bench_handlers",
            "--log-level", "WARNING", "--keep-completed-days", repr(keep_seconds / 86_400)
    ) as (conn, pool, worker):
        vacuums_before = await conn.fetchval(_AUTOVACUUMS)
        sampler = asyncio.create_task(_sample_table(conn, worker.pid, interval, timeline))
        try:
            lateness = await _arrivals(pool, rate, max(1, round(rate * seconds)))
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
    for point in timeline:
        point["autovacuums"] -= vacuums_before
    return {"summary": _soak_summary(rate, seconds, keep_seconds, lateness, timeline),
            "timeline": timeline}


_AUTOVACUUMS = "SELECT autovacuum_count FROM pg_stat_user_tables WHERE relid = 'jobs'::regclass"


async def _sample_table(conn: asyncpg.Connection, pid: int, interval: float,
                        into: list[dict[str, Any]]) -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    while True:
        row = await conn.fetchrow(
            "SELECT s.n_live_tup AS live, s.n_dead_tup AS dead, s.autovacuum_count AS autovacuums,"
            " pg_relation_size('jobs') / 1048576.0 AS table_mib,"
            " pg_relation_size('idx_jobs_pickable') / 1048576.0 AS pickable_index_mib,"
            " (SELECT count(*) FROM jobs WHERE status IN ('pending', 'retrying')) AS backlog"
            " FROM pg_stat_user_tables AS s WHERE s.relid = 'jobs'::regclass")
        resident = rss.rss_bytes(pid)
        into.append({"t": loop.time() - start, **dict(row),
                     "table_mib": float(row["table_mib"]),
                     "pickable_index_mib": float(row["pickable_index_mib"]),
                     "rss_mib": resident / rss.MIB if resident is not None else None})
        await asyncio.sleep(interval)


def _soak_summary(rate: float, seconds: float, keep_seconds: float, lateness: Sequence[float],
                  timeline: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The long run in one row: peaks over the second and the last third, so a
    line still climbing at the end shows as a last third above the second."""
    third = max(1, len(timeline) // 3)
    middle, last = timeline[third:2 * third] or timeline, timeline[-third:]

    def peak(points: Sequence[dict[str, Any]], key: str) -> float:
        return max((float(p[key]) for p in points if p[key] is not None), default=0.0)

    rss_values = [p["rss_mib"] for p in timeline if p["rss_mib"] is not None]
    return {"rate": rate, "seconds": seconds, "keep_seconds": keep_seconds,
            "jobs": round(rate * seconds), "producer_late_p99_ms": quantile(lateness, 0.99) * 1000,
            "dead_peak_middle": peak(middle, "dead"), "dead_peak_last": peak(last, "dead"),
            "live_peak_middle": peak(middle, "live"), "live_peak_last": peak(last, "live"),
            "table_mib_end": peak(timeline[-1:], "table_mib"),
            "pickable_index_mib_end": peak(timeline[-1:], "pickable_index_mib"),
            "backlog_peak": peak(timeline, "backlog"),
            "autovacuums": peak(timeline[-1:], "autovacuums"),
            "rss_mib_start": rss_values[0] if rss_values else None,
            "rss_mib_end": rss_values[-1] if rss_values else None}


def latency_result(rate: float, seconds: float, span: float, lateness: Sequence[float],
                   to_start: list[float], to_complete: list[float]) -> dict[str, Any]:
    """An open-loop run's summary (quantiles in ms, the rate achieved over
    `span`, the first to the last enqueue) and its per-job latencies (s)."""
    total = len(to_complete)
    summary = {"rate": rate, "jobs": total, "seconds": seconds,
               "achieved_rate": (total - 1) / span if span > 0 else float(total),
               "producer_late_p99_ms": quantile(lateness, 0.99) * 1000}
    for label, values in (("start", to_start), ("complete", to_complete)):
        for q in QUANTILES:
            summary[f"{label}_p{_qname(q)}_ms"] = quantile(values, q) * 1000
    return {"summary": summary, "to_start": to_start, "to_complete": to_complete}


async def _arrivals(pool: asyncpg.Pool, rate: float, total: int) -> list[float]:
    """Enqueue `total` jobs at `rate` with a plain INSERT each (see `arrivals`)."""
    async def one() -> None:
        async with pool.acquire() as c:
            await c.execute("INSERT INTO jobs (job_type) VALUES ('noop')")

    return await arrivals(one, rate, total)


async def arrivals(enqueue_one: Callable[[], Awaitable[Any]], rate: float, total: int
                   ) -> list[float]:
    """Call `enqueue_one` `total` times at `rate`, each at its own scheduled
    time whatever the earlier ones are doing (open loop); returns how late each
    was sent (the producer's own lag, reported with the result)."""
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.05
    lateness: list[float] = []
    tasks: set[asyncio.Task[Any]] = set()

    async def one() -> None:
        await enqueue_one()

    for i in range(total):
        due = start + i / rate
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        lateness.append(max(0.0, loop.time() - due))
        task = asyncio.create_task(one())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)
    return lateness


def _qname(q: float) -> str:
    return f"{q * 100:g}".replace(".", "_")


async def recovery(url: str, sig: signal.Signals, *, lease: float = 5.0, jobs: int = 3000,
                   log_dir: Path | None = None) -> dict[str, Any]:
    """One recovery trial plus the timeline of completions around the signal:
    jobs completed per 100 ms by each worker ("first" was active, "second"
    stood by), from 1 s before the signal to 1 s after recovery."""
    trial = await recovery_trial(url, sig, lease=lease, jobs=jobs, log_dir=log_dir,
                                 keep_timeline=True)
    return trial


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median and range of repeated measurements."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


# -- series of runs, with progress bars ------------------------------------------


def progress(total: int, desc: str) -> Any:
    """A progress bar for a series of runs (tqdm, notebook-aware)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, leave=False)


async def drain_matrix(url: str, *, n: int, batch_sizes: Sequence[int],
                       workers: Sequence[int], modes: Sequence[str], repeat: int,
                       handler: str = "noop") -> list[dict[str, Any]]:
    """Every batch size × worker count × mode, `repeat` times each."""
    rows = []
    with progress(len(batch_sizes) * len(workers) * len(modes) * repeat, "drain") as bar:
        for batch_size in batch_sizes:
            for count in workers:
                for mode in modes:
                    for run in range(1, repeat + 1):
                        row = await drain(url, n=n, batch_size=batch_size, workers=count,
                                          shared=mode == "shared", handler=handler)
                        rows.append({**row, "run": run})
                        bar.update()
    return rows


async def course_drains(url: str, *, n: int, repeat: int) -> list[dict[str, Any]]:
    """The course's design (`course.py`) draining n jobs, `repeat` times."""
    from jobqueue.benchmarks import course

    rows = []
    conn = await db.connect(url, application_name="jobqueue bench")
    try:
        for run in range(1, repeat + 1):
            await _reset(conn)
            await fill(conn, n)
            result = await course.drain(url)
            if result["processed"] != n:
                raise RuntimeError(f"course design processed {result['processed']} of {n}")
            rows.append({"n": n, "run": run, "system": "course design (per-job commit, ORM)",
                         **result})
    finally:
        await conn.close()
    return rows


async def drain_sizes(url: str, *, sizes: Sequence[int], batch_size: int, repeat: int
                      ) -> list[dict[str, Any]]:
    """One worker draining tables of growing size: does cost grow with N?"""
    rows = []
    with progress(len(sizes) * repeat, "table sizes") as bar:
        for n in sizes:
            for run in range(1, repeat + 1):
                row = await drain(url, n=n, batch_size=batch_size, workers=1, shared=False)
                rows.append({**row, "run": run})
                bar.update()
    return rows


async def latency_series(url: str, *, rates: Sequence[float], seconds: float, repeat: int
                         ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Open-loop runs at each rate: summaries, and every job's latencies."""
    summaries, samples = [], []
    with progress(len(rates) * repeat, "latency") as bar:
        for rate in rates:
            for run in range(1, repeat + 1):
                result = await open_loop(url, rate=rate, seconds=seconds)
                summaries.append({**result["summary"], "run": run})
                samples += [{"rate": rate, "run": run, "to_start_ms": s * 1000,
                             "to_complete_ms": c * 1000}
                            for s, c in zip(result["to_start"], result["to_complete"],
                                            strict=True)]
                bar.update()
    return summaries, samples


async def recovery_series(url: str, *, signals: Sequence[str], trials: int, lease: float,
                          jobs: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Repeated recovery trials: times, and the timeline of each trial."""
    times, timelines = [], []
    with progress(len(signals) * trials, "recovery") as bar:
        for name in signals:
            for trial in range(1, trials + 1):
                result = await recovery(url, getattr(signal, name), lease=lease, jobs=jobs)
                timeline = result.pop("timeline")
                times.append({**result, "trial": trial})
                timelines += [{"signal": name, "trial": trial, **point} for point in timeline]
                bar.update()
    return times, timelines
