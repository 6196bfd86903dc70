"""The lab's measurements of jobqueue: drains, open-loop latency, soaks.

Every one runs real `jobqueue worker` processes against a database of its
own and is timed on the database's clock from the jobs' own timestamps (a
drain from its first claim to its last completion), so process start-up is
not counted; each checks that every job completed and wrote exactly its
rows. The peers of the comparison run through the same plumbing (`peers`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import itertools
import json
import os
import shlex
import signal
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import asyncpg

from jobqueue import db, embedded
from jobqueue.benchmarks import PROGRESS_ENV, course, rss
from jobqueue.benchmarks.handlers import BENCH_TABLE
from jobqueue.lab import examples
from jobqueue.schema import migrations
from jobqueue.testing import WorkerProcess, wait_for, worker_state
from jobqueue.worker import DEFAULT_BATCH_SIZE, DEFAULT_CONCURRENCY, WorkerConfig

#: Every benchmark database is `jobqueue_bench_<name>`: the benchmarks
#: TRUNCATE `jobs` and drop their database, so they refuse any other name.
LAB_DATABASE_PREFIX = "jobqueue_bench_"

_ASYNC, _SYNC = "jobqueue.benchmarks.handlers", "jobqueue.benchmarks.sync_handlers"
#: Each benchmark handler: the module that registers it (the worker's
#: `--import`) and its payload (`process_payment`'s differs per job: `payments`).
HANDLERS: dict[str, tuple[str, dict[str, Any]]] = {
    "noop": (_ASYNC, {}), "write_row": (_ASYNC, {}), "sleep_10ms": (_ASYNC, {"seconds": 0.01}),
    "process_payment": ("jobqueue.lab.examples", {}), "noop_sync": (_SYNC, {}),
    "write_row_sync": (_SYNC, {})}
#: The handlers that write one row each (`bench_rows`).
ROW_WRITERS = ("write_row", "write_row_sync")
QUANTILES = (0.5, 0.95, 0.99, 0.999)
#: Arrivals at less than this share of the rate asked are flagged (`rate_met`),
#: completions at less than it of the arrivals' rate too (`kept_up`).
MET_SHARE = 0.95
#: The start of every open-loop run left out of its percentiles: the worker's
#: first jobs pay for cold connections and caches (the first job of a run at
#: 10 jobs/s took 15.5 ms where the others took 2), which is start-up, not
#: steady-state latency.
WARMUP_SECONDS = 1.0
#: How often `until_done` looks (not part of the timed span).
DONE_POLL = 0.05
#: Users `process_payment` jobs pay into, one after another (job i pays user
#: i mod PAYMENT_USERS): a batch of up to 1,000 jobs in each of up to four
#: lanes touches 4,000 different users, so no lane waits for another's row
#: lock and no row is hot, as in a real payments table.
PAYMENT_USERS = 10_000


async def create_demo_tables(conn: asyncpg.Connection) -> None:
    """`bench_rows`'s companions for `process_payment`: the seed's demo tables
    (`jobqueue.lab.examples.DEMO_TABLES`), in any system's database."""
    for statement in examples.DEMO_TABLES:
        await conn.execute(statement)


def check_bench_name(name: str | None) -> str:
    """`name`, if it is a benchmark database's; else ValueError."""
    if not name or not (name == LAB_DATABASE_PREFIX[:-1] or name.startswith(LAB_DATABASE_PREFIX)):
        raise ValueError("the benchmark truncates `jobs`, so it only runs on database "
                         f"'jobqueue_bench' or 'jobqueue_bench_*', not {name!r}")
    return name


@contextlib.asynccontextmanager
async def connected(url: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection of the bench's own, closed on the way out."""
    conn = await db.connect(url, application_name="jobqueue bench")
    try:
        yield conn
    finally:
        await conn.close()


async def open_bench(name: str, revision: str = "head",
                     migrate: Callable[[str], Awaitable[None]] | None = None) -> str:
    """A fresh database `jobqueue_bench_<name>` migrated to `revision` (or by
    `migrate(url)`: another checkout's code, `ab`), with the tables the
    handlers write; its URL. Pair with `close_bench(name)`."""
    server = db.database_url(embedded.database_url())
    url = await db.create_database(server, check_bench_name(f"{LAB_DATABASE_PREFIX}{name}"),
                                   replace=True)
    await (migrate(url) if migrate is not None else migrations.upgrade(url, revision))
    async with connected(url) as conn:
        await conn.execute(BENCH_TABLE)
        await create_demo_tables(conn)
    return url


async def close_bench(name: str) -> None:
    await db.drop_database(db.database_url(embedded.database_url()),
                           check_bench_name(f"{LAB_DATABASE_PREFIX}{name}"))


@contextlib.asynccontextmanager
async def bench_database(name: str) -> AsyncIterator[str]:
    """`open_bench` and `close_bench` as a context manager."""
    url = await open_bench(name)
    try:
        yield url
    finally:
        await close_bench(name)


async def environment(url: str) -> dict[str, str]:
    """The machine, and the server settings that move the numbers most, for
    every results file."""
    try:
        cpu = next((line.split(":", 1)[1].strip() for line in
                    Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), "unknown")
    except OSError:
        cpu = "unknown"
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024 ** 3
    info = {"cpu": cpu, "cores": str(os.cpu_count() or "?"), "ram": f"{ram:.1f} GiB"}
    async with connected(url) as conn:
        row = await conn.fetchrow(
            "SELECT version() AS postgres, current_setting('fsync') AS fsync,"
            " current_setting('synchronous_commit') AS synchronous_commit,"
            " current_setting('shared_buffers') AS shared_buffers")
    return {**info, **dict(row)}


def quantile_name(q: float) -> str:
    """The name a quantile has in results columns: 0.5 is `p50`, 0.999 `p99_9`."""
    return "p" + f"{q * 100:g}".replace(".", "_")


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


#: Every job gone, finished or not: `jobs` and the history with its counts.
TRUNCATE_JOBS = "TRUNCATE jobs, jobqueue_history, jobqueue_history_counts"


async def _reset(conn: asyncpg.Connection, handler: str = "noop") -> None:
    await conn.execute(f"{TRUNCATE_JOBS}, jobqueue_workers")
    await reset_writes(conn, handler)


# -- what handlers write, the same in every system's database ---------------------


def payments(n: int) -> list[dict[str, Any]]:
    """The payloads every system queues for n `process_payment` jobs: positive
    amounts (none can overdraw and fail), an id each (none is a repeat)."""
    return [{"user_id": 1 + i % PAYMENT_USERS, "amount": f"{1 + i % 97}.{i % 100:02d}",
             "payment_id": f"bench-{i}"} for i in range(n)]


async def reset_writes(conn: asyncpg.Connection, handler: str) -> None:
    """Empty what the handlers write; for `process_payment`, PAYMENT_USERS
    users at balance 0. Vacuumed, so every run starts alike."""
    await conn.execute("TRUNCATE bench_rows, demo_payments, demo_users")
    if handler == "process_payment":
        await conn.execute("INSERT INTO demo_users (id, balance)"
                           " SELECT g, 0 FROM generate_series(1, $1::integer) AS g",
                           PAYMENT_USERS)
    for table in ("bench_rows", "demo_payments", "demo_users"):
        await conn.execute(f"VACUUM ANALYZE {table}")


_WRITES = """
    SELECT (SELECT count(*) FROM bench_rows) AS rows,
           (SELECT count(DISTINCT job_id) FROM bench_rows) AS row_jobs,
           (SELECT count(*) FROM demo_payments) AS payments,
           (SELECT coalesce(sum(amount), 0) FROM demo_payments) AS paid,
           (SELECT coalesce(sum(balance), 0) FROM demo_users) AS balances,
           (SELECT count(*) FROM demo_users AS u
              LEFT JOIN (SELECT user_id, sum(amount) AS total FROM demo_payments
                         GROUP BY user_id) AS p ON p.user_id = u.id
             WHERE u.balance <> coalesce(p.total, 0)) AS mismatched"""


async def check_writes(conn: asyncpg.Connection, handler: str, n: int, system: str) -> None:
    """RuntimeError unless the n jobs of a drain wrote exactly their rows (a
    row writer's, one each; `process_payment`'s, a payment each and balances
    matching them; any other handler's, nothing)."""
    got = await conn.fetchrow(_WRITES)
    rows = n if handler in ROW_WRITERS else 0
    paid = sum((Decimal(p["amount"]) for p in payments(n)), Decimal(0)) if (
        handler == "process_payment") else Decimal(0)
    expected = {"rows": rows, "row_jobs": rows,
                "payments": n if handler == "process_payment" else 0, "paid": paid,
                "balances": paid, "mismatched": 0}
    wrong = {k: (got[k], v) for k, v in expected.items() if got[k] != v}
    if wrong:
        raise RuntimeError(f"{system}'s {handler} jobs did not write exactly their rows "
                           "(got, expected): " + ", ".join(f"{k} {g} != {v}"
                                                          for k, (g, v) in wrong.items()))


async def fill(conn: asyncpg.Connection, n: int, handler: str = "noop") -> None:
    """n jobs in one statement, vacuumed so every run starts alike."""
    job_type, payload = _job(handler)
    if handler == "process_payment":
        await conn.execute(
            "INSERT INTO jobs (job_type, payload) SELECT $1, p FROM unnest($2::jsonb[]) AS p",
            job_type, [json.dumps(p) for p in payments(n)])
    else:
        await conn.execute("INSERT INTO jobs (job_type, payload)"
                           " SELECT $1, $2::jsonb FROM generate_series(1, $3)",
                           job_type, payload, n)
    await conn.execute("VACUUM ANALYZE jobs")


def _job(handler: str) -> tuple[str, str]:
    if handler not in HANDLERS:
        raise ValueError(f"unknown benchmark handler {handler!r}; one of {sorted(HANDLERS)}")
    job_type = "sleep" if handler.startswith("sleep") else handler
    return job_type, json.dumps(HANDLERS[handler][1])


# -- the worker's command line, and labels built from it ---------------------------


def running(checkout: Path | None) -> dict[str, Any]:
    """`WorkerProcess`'s `cwd` and `env` for a process that runs the code of
    `checkout` (another revision's, `ab`), None for this one's: `python -m`
    puts its working directory first on sys.path, then PYTHONPATH, and
    both come before the installed (editable) package."""
    return {} if checkout is None else {"cwd": checkout, "env": {"PYTHONPATH": str(checkout)}}


def worker_argv(handler: str = "noop", *flags: str) -> list[str]:
    """`jobqueue worker`'s arguments: `--import` of `handler`'s module, then
    `flags` (none: the CLI's defaults, as the README starts it)."""
    _job(handler)
    return ["--import", HANDLERS[handler][0], *flags]


def _worker_args(batch_size: int, shared: bool, concurrency: int, *extra: str,
                 handler: str = "noop") -> list[str]:
    args = worker_argv(handler, "--batch-size", str(batch_size), "--concurrency",
                       str(concurrency), "--log-level", "WARNING", *extra)
    return args + (["--shared"] if shared else [])


def worker_options(argv: Sequence[str]) -> argparse.Namespace:
    """What a worker given `argv` runs with, by the CLI's own parser."""
    from jobqueue.ops.cli import build_parser

    return build_parser().parse_args(["worker", *argv])


def lanes(opts: argparse.Namespace) -> int:
    """The lanes a worker given these options runs."""
    config = WorkerConfig(concurrency=opts.concurrency or DEFAULT_CONCURRENCY,
                          queues=opts.queues or ())
    return len(config.lane_queues)


def worker_label(argv: Sequence[str], workers: int = 1) -> str:
    """A setup as the tables show it, built from the arguments the processes
    got, so a label cannot claim settings a run did not use."""
    opts = worker_options(argv)
    command = "jobqueue worker " + shlex.join(argv)
    defaults = all(a == "--import" or argv[i - 1] == "--import" for i, a in enumerate(argv))
    count = lanes(opts)
    lanes_run = f"{count} lane{'s' if count > 1 else ''}"
    each = " each" if workers > 1 else ""
    procs = (f", {workers} processes ({'shared' if opts.shared else 'exclusive'})"
             if workers > 1 else ", 1 process")
    times = f" × {workers}" if workers > 1 else ""
    prefix = "CLI defaults, as in the README " if defaults else ""
    return (f"{prefix}(`{command}`{times}): {lanes_run}{each}, batch {opts.batch_size}, "
            f"{opts.log_level} logs{procs}")


_AUTOVACUUMS = "SELECT autovacuum_count FROM pg_stat_user_tables WHERE relid = 'jobs'::regclass"
#: What a drain costs the server beyond CPU, as counters read before and
#: after it: WAL written, full-page images (a page's first change after a
#: checkpoint is logged whole) and checkpoints, server-wide (pg_stat_wal,
#: pg_stat_bgwriter; nothing else runs meanwhile); and autovacuums of `jobs`.
_COUNTERS = (f"SELECT ({_AUTOVACUUMS}) AS autovacuums, w.wal_bytes / 1048576.0 AS wal_mib,"
             " w.wal_fpi AS full_page_images, b.checkpoints_timed + b.checkpoints_req"
             " AS checkpoints FROM pg_stat_wal AS w, pg_stat_bgwriter AS b")


async def drain(url: str, *, n: int, batch_size: int, workers: int, shared: bool,
                handler: str = "noop", concurrency: int = 1, timeout: float = 900.0,
                log_dir: Path | None = None, memory: bool = False) -> dict[str, Any]:
    """n jobs drained by `workers` burst-mode processes (exclusive or shared),
    one lane at `batch_size` unless `concurrency`; with `memory`, their
    resident memory too (`rss.summary`)."""
    argv = _worker_args(batch_size, shared, concurrency, "--burst", handler=handler)
    return (await _drain(url, n, argv, workers, handler, timeout, log_dir, memory))[0]


async def cli_drain(url: str, *, n: int, handler: str = "noop", flags: Sequence[str] = (),
                    workers: int = 1, timeout: float = 900.0, log_dir: Path | None = None,
                    memory: bool = True, checkout: Path | None = None) -> dict[str, Any]:
    """A drain by workers started as the README starts them (`worker_argv`:
    no `--burst`, INFO logs to a file unless `flags` say otherwise), stopped
    by `until_done`; they run `checkout`'s code (`running`)."""
    argv = worker_argv(handler, *flags)
    return (await _drain(url, n, argv, workers, handler, timeout, log_dir, memory,
                         checkout=checkout))[0]


#: Nothing left to do: no job waiting (the pickable index) or running (the
#: processing index). Jobs a quick batch has locked stay `pending` until it
#: commits, so this is true only once every completion is committed.
_ALL_DONE = ("SELECT NOT EXISTS (SELECT 1 FROM jobs WHERE status IN ('pending', 'retrying'))"
             " AND NOT EXISTS (SELECT 1 FROM jobs WHERE status = 'processing')")


def alive(worker: WorkerProcess, before: str) -> None:
    """RuntimeError, with the tail of its log, if `worker` has exited."""
    if worker.proc.poll() is not None:
        raise RuntimeError(f"worker exited with {worker.proc.returncode} before {before}: "
                           f"{worker.log()[-2000:]}")


async def until_done(conn: asyncpg.Connection, procs: Sequence[WorkerProcess],
                     timeout: float, *, done_sql: str = _ALL_DONE,
                     registered: bool = True) -> None:
    """Wait until `done_sql` finds every job done and, for jobqueue's workers
    (`registered`), every worker has registered (so it handles signals: a
    small drain can end before a second process is up); then SIGTERM each,
    which must exit 0. A worker exiting before that is an error."""
    async def done() -> bool:
        for p in procs:
            alive(p, "the drain ended")
        if not await conn.fetchval(done_sql):
            return False
        return not registered or all([await worker_state(conn, p) is not None for p in procs])

    await wait_for(done, timeout=timeout, interval=DONE_POLL, message="every job done")
    for p in procs:
        p.signal(signal.SIGTERM)
    for p in procs:
        code = await p.wait(timeout)
        if code != 0:
            raise RuntimeError(f"worker exited with {code} on SIGTERM: {p.log()[-2000:]}")


#: A drain's row, on the database's clock; `start_skew`: how long after the
#: first claim the last worker to take part made its own first one (time in
#: which fewer workers drained than the row says).
_DRAINED = """
    SELECT count(*) FILTER (WHERE status = 'completed') AS completed, count(*) AS total,
           extract(epoch FROM max(completed_at) - min(started_at)) AS seconds,
           extract(epoch FROM min(started_at)) AS first,
           extract(epoch FROM max(completed_at)) AS last,
           count(DISTINCT worker_id) AS workers_used,
           (SELECT extract(epoch FROM max(first) - min(first)) FROM
              (SELECT min(started_at) AS first FROM jobqueue_all_jobs
               GROUP BY worker_id) AS w) AS skew,
           (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'jobs') AS dead
    FROM jobqueue_all_jobs"""


async def _drain(url: str, n: int, argv: Sequence[str], workers: int = 1,
                 handler: str = "noop", timeout: float = 900.0, log_dir: Path | None = None,
                 memory: bool = False,
                 filler: Callable[[asyncpg.Connection], Awaitable[None]] | None = None,
                 checkout: Path | None = None
                 ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Every drain: the row and the RSS samples (`memory`); `--burst` workers
    exit by themselves, others are stopped by `until_done`; `filler` queues
    the jobs instead of `fill`."""
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="jobqueue-drain-"))
    opts = worker_options(argv)
    conn = await db.connect(url, application_name="jobqueue bench")
    procs: list[WorkerProcess] = []
    sampler = rss.RssSampler([])
    try:
        await _reset(conn, handler)
        await (filler(conn) if filler is not None else fill(conn, n, handler))
        before = await conn.fetchrow(_COUNTERS)
        procs = [WorkerProcess(url, log_dir / f"drain-{i}.log", *argv, **running(checkout))
                 for i in range(workers)]
        if memory:
            sampler = rss.RssSampler(p.pid for p in procs)
            sampler.start()
        if opts.burst:
            for p in procs:
                await p.finish(timeout)
        else:
            await until_done(conn, procs, timeout)
        await sampler.stop()
        row = await conn.fetchrow(_DRAINED)
        after = await conn.fetchrow(_COUNTERS)
        if row["completed"] != n or row["total"] != n:
            raise RuntimeError(f"lost jobs: {row['completed']} of {n} completed")
        await check_writes(conn, handler, n, "jobqueue")
    finally:
        await sampler.stop()
        for p in procs:
            p.close()
        await conn.close()
    seconds = float(row["seconds"])
    result = {"n": n, "batch_size": opts.batch_size, "workers": workers,
              "mode": "shared" if opts.shared else "exclusive", "handler": handler,
              "concurrency": lanes(opts), "log_level": opts.log_level,
              "argv": shlex.join(argv), "settings": worker_label(argv, workers),
              "seconds": seconds, "jobs_per_sec": n / seconds,
              "workers_used": row["workers_used"], "start_skew_s": float(row["skew"] or 0.0),
              "dead_tuples": row["dead"],
              **{key: after[key] - before[key] for key in after.keys()}}
    result["wal_mib"] = float(result["wal_mib"])
    if not memory:
        return result, []
    first, last = float(row["first"]), float(row["last"])
    result.update(rss.summary(sampler.samples, first, last))
    return result, rss.timeline(sampler.samples, first)


async def memory_timeline(url: str, *, n: int, batch_size: int = DEFAULT_BATCH_SIZE,
                          shared: bool = False, workers: int = 1, timeout: float = 3600.0,
                          flags: Sequence[str] | None = None) -> dict[str, Any]:
    """A drain with the workers' resident memory sampled: its row and the
    timeline (`t` from the first claim, `rss_mib`), where a worker keeping
    something per job would climb. With `flags`, workers as `cli_drain` runs
    them, else burst mode with one lane at `batch_size`."""
    argv = (_worker_args(batch_size, shared, 1, "--burst") if flags is None
            else worker_argv("noop", *flags))
    row, timeline = await _drain(url, n, argv, workers, timeout=timeout, memory=True)
    return {"summary": row, "timeline": timeline}


@contextlib.asynccontextmanager
async def _one_worker_and_producers(url: str, log_path: Path, connections: int,
                                    *worker_args: str, checkout: Path | None = None
                                    ) -> AsyncIterator[tuple[asyncpg.Connection, asyncpg.Pool,
                                                             WorkerProcess]]:
    """An empty table, one active idle worker, a producer pool and a
    measuring connection."""
    async with connected(url) as conn, asyncpg.create_pool(
            **db.asyncpg_connect_args(url), min_size=connections, max_size=connections) as pool:
        await _reset(conn)
        await conn.execute("VACUUM ANALYZE jobs")
        worker = WorkerProcess(url, log_path, *worker_args, **running(checkout))
        try:
            async def active() -> bool:
                alive(worker, "it was active")
                return bool(await conn.fetchval(
                    "SELECT count(*) = 1 FROM jobqueue_workers WHERE state = 'active'"))

            await wait_for(active, timeout=60, message="an active worker")
            yield conn, pool, worker
        finally:
            await worker.stop()


async def open_loop(url: str, *, rate: float, seconds: float,
                    batch_size: int = DEFAULT_BATCH_SIZE,
                    connections: int = 8, log_dir: Path | None = None,
                    flags: Sequence[str] | None = None,
                    warmup: float = WARMUP_SECONDS,
                    checkout: Path | None = None) -> dict[str, Any]:
    """Jobs arriving at `rate` for `seconds`, each in its own transaction on
    a schedule that does not wait for the queue, picked up by one idle worker
    (one lane at `batch_size`, or `worker_argv("noop", *flags)`; `checkout`'s
    code, `running`): the summary and each job's latencies, the first
    `warmup` seconds' marked and left out of the percentiles."""
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="jobqueue-latency-"))
    argv = _worker_args(batch_size, False, 1) if flags is None else worker_argv("noop", *flags)
    async with _one_worker_and_producers(url, log_dir / "worker.log", connections,
                                         *argv, checkout=checkout) as (conn, pool, _):
        total = max(1, round(rate * seconds))
        lateness = await arrivals(_insert_noop(pool), rate, total)
        await wait_for(lambda: conn.fetchval(
            "SELECT count(*) = $1 FROM jobqueue_all_jobs WHERE status = 'completed'", total),
            timeout=seconds + 120, interval=0.05, message="every job completed")
        rows = await conn.fetch(
            "SELECT extract(epoch FROM started_at - created_at) AS to_start,"
            " extract(epoch FROM completed_at - created_at) AS to_complete,"
            " extract(epoch FROM created_at) AS created,"
            " extract(epoch FROM completed_at) AS completed"
            " FROM jobqueue_all_jobs ORDER BY created_at")
    created = [float(r["created"]) for r in rows]
    span = created[-1] - created[0]
    counted = [c - created[0] >= warmup for c in created]
    commits = [float(r["completed"]) for r, keep in zip(rows, counted, strict=True) if keep]
    summary: dict[str, Any] = {
        "rate": rate, "jobs": total, "seconds": seconds,
        "achieved_rate": (total - 1) / span if span > 0 else float(total),
        "producer_late_p99_ms": quantile(lateness, 0.99) * 1000, "warmup_s": warmup,
        "samples": sum(counted), "jobs_per_commit": len(commits) / max(1, len(set(commits)))}
    latencies = {to: [float(r[f"to_{to}"]) for r in rows] for to in ("start", "complete")}
    for to, values in latencies.items():
        kept = [v for v, keep in zip(values, counted, strict=True) if keep] or values
        for q in QUANTILES:
            summary[f"{to}_{quantile_name(q)}_ms"] = quantile(kept, q) * 1000
    summary["argv"] = shlex.join(argv)
    return {"summary": summary, "to_start": latencies["start"],
            "to_complete": latencies["complete"], "warmup": [not keep for keep in counted]}


async def soak(url: str, *, rate: float, seconds: float, keep_seconds: float,
               interval: float = 1.0, connections: int = 8,
               log_dir: Path | None = None) -> dict[str, Any]:
    """A long steady run on one worker keeping completed jobs
    `keep_seconds` (those past it are deleted as they leave `jobs`), its
    table, backlog, autovacuums and memory sampled every `interval` s: a
    healthy queue draws flat or saw-toothed lines, none climbing."""
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="jobqueue-soak-"))
    timeline: list[dict[str, Any]] = []
    async with _one_worker_and_producers(
            url, log_dir / "worker.log", connections, "--import", "jobqueue.benchmarks.handlers",
            "--log-level", "WARNING", "--keep-completed-days", repr(keep_seconds / 86_400)
    ) as (conn, pool, worker):
        vacuums_before = await conn.fetchval(_AUTOVACUUMS)
        sampler = asyncio.create_task(_sample_table(conn, worker.pid, interval, timeline))
        try:
            lateness = await arrivals(_insert_noop(pool), rate, max(1, round(rate * seconds)))
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
    for point in timeline:
        point["autovacuums"] -= vacuums_before
    return {"summary": _soak_summary(rate, seconds, keep_seconds, lateness, timeline),
            "timeline": timeline}



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
    """Peaks over the second and last thirds: a climb shows as the last higher."""
    third = max(1, len(timeline) // 3)
    middle, last = timeline[third:2 * third] or timeline, timeline[-third:]

    def peak(points: Sequence[dict[str, Any]], key: str) -> float:
        return max((float(p[key]) for p in points if p[key] is not None), default=0.0)

    rss_values = [p["rss_mib"] for p in timeline if p["rss_mib"] is not None]
    return {"rate": rate, "seconds": seconds, "keep_seconds": keep_seconds,
            "jobs": round(rate * seconds), "producer_late_p99_ms": quantile(lateness, 0.99) * 1000,
            "dead_peak_middle": peak(middle, "dead"), "dead_peak_last": peak(last, "dead"),
            "live_peak_middle": peak(middle, "live"), "live_peak_last": peak(last, "live"),
            "table_mib_middle": peak(middle[-1:], "table_mib"),
            "table_mib_end": peak(timeline[-1:], "table_mib"),
            "pickable_index_mib_end": peak(timeline[-1:], "pickable_index_mib"),
            "backlog_peak": peak(timeline, "backlog"),
            "autovacuums": peak(timeline[-1:], "autovacuums"),
            "rss_mib_start": rss_values[0] if rss_values else None,
            "rss_mib_end": rss_values[-1] if rss_values else None}


def _insert_noop(pool: asyncpg.Pool) -> Callable[[], Awaitable[None]]:
    async def one() -> None:
        async with pool.acquire() as c:
            await c.execute("INSERT INTO jobs (job_type) VALUES ('noop')")
    return one


async def arrivals(enqueue_one: Callable[[], Awaitable[Any]], rate: float, total: int
                   ) -> list[float]:
    """`enqueue_one` `total` times at `rate`, open loop; how late each was
    sent (the producer's own lag)."""
    return await arrivals_at(enqueue_one, [i / rate for i in range(total)])


async def arrivals_at(enqueue_one: Callable[[], Awaitable[Any]], offsets: Iterable[float],
                      start: float | None = None) -> list[float]:
    """`arrivals` at `offsets` seconds after `start` (the loop's clock;
    default 50 ms from now), none waiting for another."""
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.05 if start is None else start
    lateness: list[float] = []
    tasks: set[asyncio.Task[Any]] = set()

    async def one() -> None:
        await enqueue_one()

    for offset in offsets:
        due = start + offset
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


# -- series of runs, with progress bars ------------------------------------------


class _Steps(contextlib.AbstractContextManager["_Steps"]):
    """A series' progress as JSON lines in the file the bench driver reads."""

    def __init__(self, total: int, desc: str, path: Path) -> None:
        self.total, self.desc, self.path, self.done = total, desc, path, 0
        self.started = time.time()
        self.update(0)

    def update(self, n: int = 1) -> None:
        self.done += n
        line = {"desc": self.desc, "done": self.done, "total": self.total,
                "started": self.started, "t": time.time()}
        with self.path.open("a") as f:
            f.write(json.dumps(line) + "\n")

    def __exit__(self, *exc: object) -> None:
        return None


def progress(total: int, desc: str) -> Any:
    """Progress of a series of runs. Under `make bench` the notebooks run in
    a kernel with no terminal, where a bar would only add hundreds of stderr
    lines to the committed notebook: the steps go as JSON lines to the file
    the driver names (`PROGRESS_ENV`), and it shows them. A notebook opened
    by hand gets a tqdm bar."""
    target = os.environ.get(PROGRESS_ENV)
    if target:
        return _Steps(total, desc, Path(target))
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, leave=False)


def steps(desc: str, *axes: Iterable[Any]) -> Iterator[tuple[Any, ...]]:
    """Every combination of `axes` (the first outermost), with `progress`
    updated after each is done: the loop of every series."""
    combos = list(itertools.product(*axes))
    with progress(len(combos), desc) as bar:
        for combo in combos:
            yield combo
            bar.update()


#: A drain shorter than this is not a measurement: one slow commit or a
#: process scheduled late moves its rate by tens of percent (10,000 jobs at
#: batch 1,000 drain in 0.2-0.3 s, and one cell's runs ranged 21.6k-36.9k).
MIN_DRAIN_SECONDS = 1.0
#: The largest drain sizing may ask for (a million jobs is minutes of filling
#: and draining, and a checkpoint inside it).
MAX_SIZED_N = 500_000
#: Sizing runs a setting may take before a short drain counts anyway (and is
#: flagged as short wherever it is shown).
_MAX_SIZING_RUNS = 3


def sized_n(rate: float, seconds: float, *, least: int = 100, most: int = MAX_SIZED_N) -> int:
    """Jobs for a drain of about `seconds` at `rate`, to two significant figures."""
    want = max(least, rate * seconds)
    step = 10 ** max(0, len(str(int(want))) - 2)
    return int(min(most, -(-int(want) // step) * step))


async def drain_matrix(url: str, *, n: int | dict[int, int], batch_sizes: Sequence[int],
                       workers: Sequence[int], modes: Sequence[str], repeat: int,
                       handler: str = "noop", seconds: float = 1.5,
                       min_seconds: float = MIN_DRAIN_SECONDS,
                       max_n: int = MAX_SIZED_N) -> list[dict[str, Any]]:
    """Every batch size × worker count × mode, `repeat` drains each, sized by
    a `Sizer` starting at `n` (or `n[batch_size]`, or the rate the last
    setting of that batch size measured)."""
    rows: list[dict[str, Any]] = []
    rates: dict[int, float] = {}
    sizers: dict[tuple[int, int, str], Sizer] = {}
    for batch_size, count, mode, run in steps("drain", batch_sizes, workers, modes,
                                              range(1, repeat + 1)):
        if (setting := (batch_size, count, mode)) not in sizers:
            sizers[setting] = Sizer(sized_n(rates[batch_size], seconds, most=max_n)
                                    if batch_size in rates else
                                    n[batch_size] if isinstance(n, dict) else n,
                                    seconds=seconds, min_seconds=min_seconds, max_n=max_n)
        rows += await sizers[setting].counted(run, functools.partial(
            drain, url, batch_size=batch_size, workers=count, shared=mode == "shared",
            handler=handler))
        rates[batch_size] = rows[-1]["jobs_per_sec"]
    return rows


class Sizer:
    """Sizes a setting's drains to last about `seconds`, each from the last
    rate. One shorter than `min_seconds` stays in the rows with `counted`
    False and runs again bigger, unless it drained `max_n` jobs or the
    setting had _MAX_SIZING_RUNS of them."""

    def __init__(self, size: int, *, seconds: float, min_seconds: float, max_n: int) -> None:
        self.size, self.seconds, self.min_seconds, self.max_n = size, seconds, min_seconds, max_n
        self.sizing = 0

    async def counted(self, run: int, drain_n: Callable[..., Awaitable[dict[str, Any]]]
                      ) -> list[dict[str, Any]]:
        """Drains by `drain_n(n=…)` until one counts (number `run`): the rows."""
        rows = []
        while True:
            row = await drain_n(n=self.size)
            short = (row["seconds"] < self.min_seconds and self.size < self.max_n
                     and self.sizing < _MAX_SIZING_RUNS)
            self.sizing += short
            rows.append({**row, "run": 0 if short else run, "counted": not short})
            self.size = sized_n(row["jobs_per_sec"], self.seconds, most=self.max_n)
            if not short:
                return rows


async def course_drains(url: str, *, n: int, repeat: int) -> list[dict[str, Any]]:
    """The course's design (`course.py`) draining n no-op jobs."""
    rows = []
    async with connected(url) as conn:
        for run in range(1, repeat + 1):
            await _reset(conn)
            await fill(conn, n)
            result = await course.drain(url)
            if result["processed"] != n:
                raise RuntimeError(f"course design processed {result['processed']} of {n}")
            rows.append({"n": n, "run": run, "system": "course design (per-job commit, ORM)",
                         **result})
    return rows


async def drain_sizes(url: str, *, sizes: Sequence[int], batch_size: int, repeat: int
                      ) -> list[dict[str, Any]]:
    """One worker draining tables of growing size: does cost grow with N?"""
    return [{**await drain(url, n=n, batch_size=batch_size, workers=1, shared=False),
             "run": run} for n, run in steps("table sizes", sizes, range(1, repeat + 1))]


async def latency_series(url: str, *, rates: Sequence[float], seconds: float, repeat: int,
                         warmup: float = WARMUP_SECONDS
                         ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Open-loop runs at each rate: summaries, and every job's latencies."""
    summaries, samples = [], []
    for rate, run in steps("latency", rates, range(1, repeat + 1)):
        result = await open_loop(url, rate=rate, seconds=seconds, warmup=warmup)
        summaries.append({**result["summary"], "run": run})
        samples += [{"rate": rate, "run": run, "to_start_ms": s * 1000,
                     "to_complete_ms": c * 1000, "warmup": w}
                    for s, c, w in zip(result["to_start"], result["to_complete"],
                                       result["warmup"], strict=True)]
    return summaries, samples


# -- queues and priorities ----------------------------------------------------------

#: The priorities of the routing drains: the default, two above and two below.
ROUTING_PRIORITIES = (-2, -1, 0, 1, 2)


def queue_names(count: int) -> list[str]:
    """`q0`, `q1`, …: the queues of a routing drain."""
    return [f"q{i}" for i in range(count)]


def lanes_per_queue(queues: Sequence[str], lanes: int = 1) -> list[str]:
    """`--queues q0=1,q1=1,…`: `lanes` of its own for every queue."""
    return ["--queues", ",".join(f"{q}={lanes}" for q in queues)]


async def fill_routed(conn: asyncpg.Connection, n: int, queues: Sequence[str],
                      priorities: Sequence[int]) -> None:
    """n no-op jobs interleaved over `queues` × `priorities`, so that none
    comes first in the table."""
    await conn.execute(
        "INSERT INTO jobs (job_type, payload, queue, priority)"
        " SELECT 'noop', '{}', ($2::text[])[1 + g % $3], ($4::integer[])[1 + (g / $3) % $5]"
        " FROM generate_series(0, $1 - 1) AS g",
        n, list(queues), len(queues), list(priorities), len(priorities))
    await conn.execute("VACUUM ANALYZE jobs")


#: Jobs that completed after a job of lower priority in their own queue had
#: (a batch's jobs share one completion time, so jobs committed together
#: count as at once), and the most by which one did.
_PRIORITY_ORDER = """
    WITH levels AS (
        SELECT queue, priority, min(completed_at) AS first
        FROM jobqueue_all_jobs
        GROUP BY queue, priority
    ), bounds AS (
        SELECT queue, priority,
               min(first) OVER (PARTITION BY queue ORDER BY priority
                                ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS lower_first
        FROM levels
    )
    SELECT count(*) AS late_jobs,
           coalesce(extract(epoch FROM max(j.completed_at - b.lower_first)), 0) AS late_by
    FROM jobqueue_all_jobs AS j JOIN bounds AS b USING (queue, priority)
    WHERE j.completed_at > b.lower_first"""
#: When each queue × priority had its first and last job completed, in
#: seconds from the drain's first claim.
_SPANS = """
    SELECT queue, priority, count(*) AS jobs,
           extract(epoch FROM min(completed_at) - t0) AS first_s,
           extract(epoch FROM max(completed_at) - t0) AS last_s
    FROM jobqueue_all_jobs, (SELECT min(started_at) AS t0 FROM jobqueue_all_jobs) AS s
    GROUP BY queue, priority, t0
    ORDER BY queue, priority DESC"""


async def routing_drain(url: str, *, n: int, queues: Sequence[str],
                        priorities: Sequence[int] = ROUTING_PRIORITIES,
                        flags: Sequence[str] = (), timeout: float = 900.0
                        ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A `cli_drain` of n no-op jobs over `queues` × `priorities`: its row,
    with how priority held in each queue (`late_jobs`, `late_by_s`), and
    each queue × priority's first and last completion."""
    names = list(queues)
    row, _ = await _drain(url, n, worker_argv("noop", *flags), timeout=timeout,
                          filler=lambda conn: fill_routed(conn, n, names, priorities))
    async with connected(url) as conn:
        order = await conn.fetchrow(_PRIORITY_ORDER)
        spans = [{**dict(r), "first_s": float(r["first_s"]), "last_s": float(r["last_s"])}
                 for r in await conn.fetch(_SPANS)]
    row.update(queues=len(names), priorities=len(priorities),
               priority_range=f"{min(priorities)}..{max(priorities)}",
               late_jobs=int(order["late_jobs"]), late_by_s=float(order["late_by"]))
    return row, spans


def routing_setups(queues: int, priorities: Sequence[int] = ROUTING_PRIORITIES
                   ) -> list[dict[str, Any]]:
    """One queue at one priority (the baseline), then `queues` ×
    `priorities`, then the same with a lane per queue."""
    names, levels = queue_names(queues), tuple(priorities)
    spread = f"{queues} queues × {len(priorities)} priorities"
    return [{"setup": setup, "queues": on, "priorities": at, "flags": flags}
            for setup, on, at, flags in (("1 queue, 1 priority", ["default"], (0,), []),
                                         (spread, names, levels, []),
                                         (f"{spread}, a lane per queue", names, levels,
                                          lanes_per_queue(names)))]


async def routing_series(url: str, *, n: int, queues: int, repeat: int,
                         priorities: Sequence[int] = ROUTING_PRIORITIES
                         ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """`repeat` rounds of every `routing_setups` setup (a round runs each
    once, so a slow spell hits all): the rows and the spans."""
    setups = routing_setups(queues, priorities)
    rows, spans = [], []
    for run, (order, setup) in steps("queues", range(1, repeat + 1), enumerate(setups)):
        row, span = await routing_drain(url, n=n, queues=setup["queues"],
                                        priorities=setup["priorities"], flags=setup["flags"])
        rows.append({"setup": setup["setup"], "setup_order": order, **row, "run": run})
        spans += [{"setup": setup["setup"], "run": run, **s} for s in span]
    return rows, spans


# -- sync handlers beside async ones ------------------------------------------------

#: The drains of the sync-handler comparison, in the order a round runs them:
#: (handler, its kind, what it does). The same work as an async handler and
#: as a sync one (`jobqueue.benchmarks.sync_handlers`), run in threads.
SYNC_SETUPS = (("noop", "async", "no-op"), ("noop_sync", "sync", "no-op"),
               ("write_row", "async", "one INSERT"), ("write_row_sync", "sync", "one INSERT"))


async def sync_series(url: str, *, n: int | dict[str, int], repeat: int, seconds: float,
                      min_seconds: float = MIN_DRAIN_SECONDS, max_n: int = MAX_SIZED_N,
                      flags: Sequence[str] = (),
                      setups: Sequence[tuple[str, str, str]] = SYNC_SETUPS
                      ) -> list[dict[str, Any]]:
    """Each of `setups` by one `cli_drain` worker, in `repeat` rounds, each
    handler's drains sized by a `Sizer` of its own; rows carry the worker's
    `threads`."""
    sizers = {handler: Sizer(n[handler] if isinstance(n, dict) else n, seconds=seconds,
                             min_seconds=min_seconds, max_n=max_n)
              for handler, _, _ in setups}
    rows = []
    for run, (order, (handler, kind, work)) in steps("sync handlers", range(1, repeat + 1),
                                                     enumerate(setups)):
        threads = worker_options(worker_argv(handler, *flags)).threads
        drained = await sizers[handler].counted(run, functools.partial(
            cli_drain, url, handler=handler, flags=flags, memory=False))
        rows += [{"setup_order": order, "kind": kind, "work": work, "threads": threads, **row}
                 for row in drained]
    return rows
