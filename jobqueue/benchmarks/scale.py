"""The queue at scale: a history of finished jobs and another service's
backlog beside a worker, built to a size given as parameters.

`build` fills a database as a busy queue of a release before the history
(migration 0012) leaves it after a week: `finished` jobs completed over
`days` (a share of them failed for good) in `jobs`, and `waiting` jobs of
types this worker has no handler for, spread over ten queues of their own.
On it, `delete_as_pruned` times retention as those releases did it (rows
deleted in slices), `archive_all` moves the finished jobs into the history
as the maintenance leader does after an upgrade, `expire_oldest` times
retention as it is now (a day's partition dropped), `operator_reads` times
what an operator's tools read (`jobqueue status`, `/metrics`, `/queues`,
the dashboard's overview and its live refresh, pages of `GET /jobs`) and
`drains` times a worker started as the README starts it, at its defaults
and with `--queues default`, draining jobs of its own beside the backlog.
The notebook `scale.ipynb` sets the sizes (`param`), compares with a table
that holds only the jobs drained.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from jobqueue.benchmarks.scenarios import connected, quantile, worker_argv
from jobqueue.ops import status
from jobqueue.ops.api import SHARED_TTL, create_app
from jobqueue.ops.dashboard.views import OVERVIEW_TTL
from jobqueue.schema.queries import queries
from jobqueue.testing import WorkerProcess, wait_for
from jobqueue.worker import WorkerConfig, upkeep

#: The queues the backlog waits in, and its job types (none of them ours).
BACKLOG_QUEUES = 10
BACKLOG_TYPES = 7

#: Seconds between two timed reads: longer than any shared reading lives.
FRESH = max(SHARED_TTL, OVERVIEW_TTL) + 0.1

_SIZES = """
SELECT pg_total_relation_size('jobs') / 1048576.0 AS total_mib,
       pg_relation_size('jobs') / 1048576.0 AS heap_mib,
       pg_indexes_size('jobs') / 1048576.0 AS indexes_mib,
       (SELECT count(*) FROM jobs) AS jobs"""
#: The history's partitions (none before migration 0012), whole, with their indexes.
_HISTORY = """
SELECT count(*) AS partitions,
       coalesce(sum(pg_total_relation_size(relid)), 0) / 1048576.0 AS history_mib
FROM pg_partition_tree(to_regclass('jobqueue_history'))
WHERE isleaf"""
#: A job's id made at `at` (a timestamptz) in the layout of `jobqueue_id`
#: (its first 48 bits the millisecond, as in UUIDv7) with `i` as the rest:
#: the id the job would have had, had it been enqueued then.
_ID_AT = """CAST(lpad(to_hex(u / 1000), 12, '0') || '7' || lpad(to_hex(u % 1000), 3, '0')
                 || '8' || lpad(to_hex(i), 15, '0') AS uuid)"""
#: Retention as releases before the history (0012) ran it, one slice of at
#: most $2 rows past $1 seconds: the statement `prune`, without its waiters.
OLD_PRUNE = """
DELETE FROM jobs
WHERE id IN (SELECT id FROM jobs
             WHERE completed_at < now() - make_interval(secs => $1) AND status = 'completed'
             LIMIT $2)"""


@contextlib.asynccontextmanager
async def bulk_load(conn: asyncpg.Connection) -> AsyncIterator[None]:
    """Rows written into `jobs` inside this block are indexed afterwards,
    each index (the primary key too) built once with room to sort in, as a
    restore does: minutes saved at millions of rows against inserting into
    them row by row. The insert trigger is off meanwhile: nobody listens,
    and it would keep every new row in a transition table to announce them."""
    await conn.execute("SET maintenance_work_mem = '512MB'")
    indexes = await conn.fetch("SELECT indexname, indexdef FROM pg_indexes "
                               "WHERE tablename = 'jobs' AND indexname <> 'pk_jobs'")
    for index in indexes:
        await conn.execute(f'DROP INDEX "{index["indexname"]}"')
    await conn.execute("ALTER TABLE jobs DROP CONSTRAINT pk_jobs")
    await conn.execute("ALTER TABLE jobs DISABLE TRIGGER jobs_notify_insert")
    yield
    await conn.execute("ALTER TABLE jobs ENABLE TRIGGER jobs_notify_insert")
    await conn.execute("ALTER TABLE jobs ADD CONSTRAINT pk_jobs PRIMARY KEY (id)")
    for index in indexes:
        await conn.execute(index["indexdef"])


async def build(url: str, *, finished: int, waiting: int, days: float = 7.0,
                failed_share: float = 0.01) -> dict[str, Any]:
    """Replace the jobs of `url` with `finished` finished jobs and `waiting`
    waiting ones of the backlog, in one statement each (`bulk_load`), all in
    `jobs`, as a release before the history kept them. Each finished job's
    id is the one it would have had (`_ID_AT`, made when it was enqueued),
    so that it is found by id once in the history."""
    async with connected(url) as conn:
        history = await conn.fetchval("SELECT to_regclass('jobqueue_history') IS NOT NULL")
        await conn.execute("TRUNCATE jobs" + (", jobqueue_history, jobqueue_history_counts"
                                              if history else ""))
        started = time.monotonic()
        async with bulk_load(conn):
            await conn.execute(f"""
                INSERT INTO jobs (id, job_type, payload, queue, status, created_at, started_at,
                                  completed_at, run_at, error_message, worker_id)
                SELECT {_ID_AT}, 'job_' || (i % 5), jsonb_build_object('n', i), 'default',
                       CASE WHEN i % $2 = 0 THEN 'failed' ELSE 'completed' END,
                       at - interval '2 ms', at - interval '1 ms', at, at - interval '2 ms',
                       CASE WHEN i % $2 = 0 THEN 'RuntimeError: boom' END, 1
                FROM generate_series(1, $1) AS i,
                     LATERAL (SELECT now() - $3 * interval '1 day' * (1 - i::float8 / $1)
                              AS at) t,
                     LATERAL (SELECT CAST(extract(epoch FROM at - interval '2 ms') * 1000000
                                          AS bigint) AS u) m
                """, finished, max(1, round(1 / failed_share)) if failed_share else finished + 1,
                days)
            await conn.execute("""
                INSERT INTO jobs (job_type, payload, queue, run_at)
                SELECT 'other_' || (i % $2), '{}', 'svc' || (i % $3),
                       now() - interval '1 hour' + i * interval '1 ms'
                FROM generate_series(1, $1) AS i""", waiting, BACKLOG_TYPES, BACKLOG_QUEUES)
        await conn.execute("VACUUM ANALYZE jobs")
        row = dict(await conn.fetchrow(_SIZES) or {})
    return {"finished": finished, "waiting": waiting, "build_s": time.monotonic() - started,
            **{k: float(v) for k, v in row.items()}}


async def sizes(url: str) -> dict[str, float]:
    """How large `jobs` and the history are now, in MiB, and their rows."""
    async with connected(url) as conn:
        row = {**dict(await conn.fetchrow(_SIZES) or {}),
               **dict(await conn.fetchrow(_HISTORY) or {})}
    return {k: float(v) for k, v in row.items()}


async def delete_as_pruned(url: str, *, rows: int, slice_rows: int = 10_000) -> dict[str, Any]:
    """Retention as releases before the history ran it (`OLD_PRUNE`): `rows`
    of the oldest completed jobs deleted, `slice_rows` a statement, each
    timed. What it took per row is what a day of a busy queue's history
    cost to let go of."""
    times = []
    async with connected(url) as conn:
        cutoff = await conn.fetchval(
            "SELECT extract(epoch FROM now() - completed_at) FROM jobs "
            "WHERE status = 'completed' ORDER BY completed_at OFFSET $1 LIMIT 1", rows - 1)
        deleted = 0
        while deleted < rows:
            start = time.perf_counter()
            status = await conn.execute(OLD_PRUNE, float(cutoff) - 1e-3,
                                        min(slice_rows, rows - deleted))
            times.append(time.perf_counter() - start)
            if not int(status.split()[-1]):
                break
            deleted += int(status.split()[-1])
    return {"how": "rows deleted (before 0012)", "rows": deleted, "seconds": sum(times),
            "rows_per_sec": deleted / sum(times), "statements": len(times),
            "statement_p50_ms": quantile(times, 0.5) * 1000,
            "statement_max_ms": max(times) * 1000}


async def archive_all(url: str, *, keep_days: float = 30.0) -> dict[str, Any]:
    """Every finished job moved from `jobs` to the history as the
    maintenance leader moves them after an upgrade (`upkeep.archive`, a
    slice of `upkeep.ARCHIVE_SLICE` at a time), without the leader's tick
    between slices: the rate here is what the database can do, the
    leader's one slice a tick caps it lower. Retention is `keep_days` for
    both statuses, so that every job of the week moves (the defaults, a day
    of completed jobs, would delete most of them instead). Then VACUUM
    ANALYZE `jobs`, as autovacuum would after so many deletes."""
    config = WorkerConfig(archive_after=0, keep_completed=keep_days * 86_400,
                          keep_failed=keep_days * 86_400)
    times, moved, reached = [], 0, None
    async with connected(url) as conn:
        while True:  # each slice from where the last one ended, as the leader goes
            start = time.perf_counter()
            n, reached = await upkeep.archive(conn, config, reached)
            times.append(time.perf_counter() - start)
            moved += n
            if n < upkeep.ARCHIVE_SLICE:
                break
        vacuum_start = time.perf_counter()
        await conn.execute("VACUUM ANALYZE jobs")
        vacuum_s = time.perf_counter() - vacuum_start
    return {"how": "moved to the history (0012)", "rows": moved, "seconds": sum(times),
            "rows_per_sec": moved / sum(times), "statements": len(times),
            "statement_p50_ms": quantile(times, 0.5) * 1000,
            "statement_max_ms": max(times) * 1000, "vacuum_s": vacuum_s}


#: Who holds a lock on the history's tables now, other than this session.
_HISTORY_LOCKS = """
SELECT DISTINCT a.backend_type || ': ' || coalesce(nullif(a.application_name, ''), '-')
       || ' (' || l.mode || ' on ' || c.relname || ')' AS holder
FROM pg_locks AS l
JOIN pg_class AS c ON c.oid = l.relation
JOIN pg_stat_activity AS a ON a.pid = l.pid
WHERE l.granted AND l.pid <> pg_backend_pid() AND c.relname LIKE 'jobqueue_history%'"""


async def expire_oldest(url: str, *, keep_days: float = 5.0, tries: int = 3) -> dict[str, Any]:
    """Retention as it is now (`upkeep.expire`), with both retentions
    `keep_days`: the partitions of the history's days that ended longer
    ago than that go (with the default and a week of history, the oldest
    two days: a part of one, and one whole). How many rows went with them
    (from the history's counts) and how long the passes took. A partition
    whose lock is not had within `expire`'s 200 ms is left for the next
    pass, a minute later for the leader: here up to `tries` passes a few
    seconds apart, and `held_by` names who held a lock on the history at a
    pass that left one behind."""
    keep = keep_days * 86_400
    config = WorkerConfig(keep_completed=keep, keep_failed=keep)
    seconds, dropped, passes, held_by = 0.0, 0, 0, set()
    async with connected(url) as conn:
        before = int(await conn.fetchval("SELECT sum(n) FROM jobqueue_history_counts"))
        while passes < tries:
            passes += 1
            start = time.perf_counter()
            dropped += await upkeep.expire(conn, config)
            seconds += time.perf_counter() - start
            left = await queries["history_expired"].fetch(
                conn, keep_completed=keep, keep_failed=keep)
            if not left:
                break
            held_by |= {r["holder"] for r in await conn.fetch(_HISTORY_LOCKS)}
            await asyncio.sleep(FRESH)
        after = int(await conn.fetchval(
            "SELECT coalesce(sum(n), 0) FROM jobqueue_history_counts"))
    return {"how": "days dropped (0012)", "rows": before - after, "seconds": seconds,
            "rows_per_sec": (before - after) / seconds, "statements": dropped,
            "statement_p50_ms": seconds / max(dropped, 1) * 1000,
            "statement_max_ms": seconds * 1000, "passes": passes,
            "held_by": "; ".join(sorted(held_by))}


async def _timed(step: Callable[[], Awaitable[Any]], repeat: int,
                 gap: float = 0.0) -> tuple[float, Any]:
    """The median of `repeat` runs of `step`, in ms, and its last result;
    `gap` seconds before each, not timed."""
    times, result = [], None
    for _ in range(repeat):
        await asyncio.sleep(gap)
        start = time.perf_counter()
        result = await step()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), result


async def operator_reads(url: str, *, repeat: int = 3) -> list[dict[str, Any]]:
    """Each read an operator's tools make, the median of `repeat` in ms:
    through the API and the dashboard in this process (the time is the
    server's answer, nearly all of it the database's; each read `FRESH`
    seconds after the last, when the readings shared among clients have gone
    stale; `answer` says which counts were estimates), `jobqueue status`'s
    summary on one connection, and the `jobqueue status` command as a
    user runs it (its process start included)."""
    rows: list[dict[str, Any]] = []
    app = create_app(url, token=None)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                               base_url="http://localhost")

    async def get(path: str) -> httpx.Response:
        return await client.get(path)

    def row(read: str, ms: float, answer: str) -> None:
        rows.append({"read": read, "ms": ms, "answer": answer})

    try:
        await get("/queues")  # the engine's first connection, not a read
        for read, path in (("GET /metrics", "/metrics"), ("GET /queues", "/queues"),
                           ("dashboard overview", "/"),
                           ("dashboard live refresh", "/dashboard/overview"),
                           ("GET /jobs, first page", "/jobs"),
                           ("GET /jobs?status=failed", "/jobs?status=failed")):
            # Past the life of the readings the API and the dashboard share
            # among clients (SHARED_TTL, OVERVIEW_TTL), so each one is read
            # afresh, as a scrape every 15 s or a dashboard opened now finds it.
            ms, answer = await _timed(functools.partial(get, path), repeat, gap=FRESH)
            row(read, ms, str(answer.status_code) + _counts(answer))
        deep = "/jobs"
        for _ in range(10):  # ten pages down, by the cursor each page gives
            page = (await get(deep)).json()
            if not page.get("next"):
                break
            deep = f"/jobs?before={page['next']}"
        ms, answer = await _timed(lambda: get(deep), repeat, gap=FRESH)
        row("GET /jobs, 11th page", ms, str(answer.status_code))
    finally:
        await client.aclose()
        await app.state.jobqueue_engine.dispose()
    async with connected(url) as conn:
        ms, summary = await _timed(lambda: status.queue_summary(conn), repeat)
        row("jobqueue status, its summary", ms, "read" + _said(summary["estimated"]))
    env = {**os.environ, "DATABASE_URL": url}

    async def command() -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "jobqueue", "status"], env=env,
            capture_output=True, text=True, timeout=600)

    ms, done = await _timed(command, repeat)
    row("jobqueue status (the command)", ms, f"exit {done.returncode}")
    return rows


def _said(estimated: list[str]) -> str:
    return f"; estimated: {', '.join(estimated)}" if estimated else ""


def _counts(answer: httpx.Response) -> str:
    """Which counts a reading that counts jobs gave as estimates."""
    if answer.request.url.path == "/queues":
        return _said(answer.json()["estimated"])
    if answer.request.url.path == "/metrics":
        return _said([m.group(1) for m in re.finditer(
            r'^jobqueue_jobs_estimated\{status="(\w+)"\} 1', answer.text, re.M)])
    if answer.request.url.path in ("/", "/dashboard/overview"):  # the cards marked ≈
        return _said(re.findall(r'data-status="(\w+)" title=', answer.text))
    return ""


async def drain_beside(url: str, *, n: int, flags: tuple[str, ...] = (),
                       timeout: float = 900.0) -> dict[str, Any]:
    """`n` no-op jobs of our own, in queue `default`, drained by one
    `jobqueue worker` with `flags` (none: the README's defaults) beside
    whatever else waits; jobs/s from its first start to its last completion
    on the database's clock. The backlog is left as it was."""
    log = Path(tempfile.mkdtemp(prefix="jobqueue-scale-")) / "worker.log"
    async with connected(url) as conn:
        await conn.execute("DELETE FROM jobs WHERE job_type = 'noop'")
        # This drain's jobs are those from its first id on (ids sort in the
        # order jobs were made): an earlier drain's, which the leader may
        # have moved to the history meanwhile, are not among them.
        first = await conn.fetchval(
            "WITH new AS (INSERT INTO jobs (job_type, payload) "
            "             SELECT 'noop', '{}' FROM generate_series(1, $1) RETURNING id) "
            "SELECT id FROM new ORDER BY id LIMIT 1", n)
        await conn.execute("VACUUM ANALYZE jobs")
        before = await conn.fetchval("SELECT autovacuum_count FROM pg_stat_user_tables "
                                     "WHERE relid = 'jobs'::regclass")
        worker = WorkerProcess(url, log, *worker_argv("noop", *flags))
        try:
            await wait_for(lambda: conn.fetchval(
                "SELECT count(*) = $1 FROM jobqueue_all_jobs WHERE id >= $2 "
                "AND job_type = 'noop' AND status = 'completed'", n, first),
                timeout=timeout, interval=0.05,
                message="our jobs drained")
            worker.signal(signal.SIGTERM)
            await worker.wait(60)
        finally:
            worker.close()
        row = await conn.fetchrow(
            "SELECT extract(epoch FROM max(completed_at) - min(started_at)) AS seconds,"
            " (SELECT autovacuum_count FROM pg_stat_user_tables"
            "  WHERE relid = 'jobs'::regclass) AS autovacuums,"
            " (SELECT count(*) FROM jobs WHERE job_type <> 'noop'"
            "  AND status IN ('pending', 'retrying')) AS backlog"
            " FROM jobqueue_all_jobs WHERE id >= $1 AND job_type = 'noop'", first)
    assert row is not None
    seconds = float(row["seconds"])
    return {"n": n, "flags": " ".join(flags) or "(defaults)", "seconds": seconds,
            "jobs_per_sec": n / seconds, "autovacuums": row["autovacuums"] - before,
            "backlog_left": row["backlog"]}


#: How a worker of an earlier release claims, in SQL: from queue `default`
#: by its claim index since revision 0004; by due time alone, which every
#: revision accepts (on a small table: with no index in that order since
#: 0004, it sorts every waiting job).
CLAIM_BY_QUEUE = ("SELECT id FROM jobs WHERE queue = 'default' "
                  "AND status IN ('pending', 'retrying') AND run_at <= now() "
                  "ORDER BY priority DESC, run_at LIMIT 20 FOR UPDATE SKIP LOCKED")
CLAIM_ANY_QUEUE = ("SELECT id FROM jobs WHERE status = 'pending' ORDER BY run_at "
                   "LIMIT 20 FOR UPDATE SKIP LOCKED")


@dataclass
class Traffic:
    """A queue in use, as any release's producers and workers use it, in
    SQL every revision accepts: one job inserted every `1 / rate` s (each
    insert timed, from the moment it was due to go), and a worker of an
    earlier release claiming jobs with `SKIP LOCKED` (`claim`) and
    completing them, 20 at a time. What a migration must not disturb."""

    url: str
    rate: float = 500.0
    claim: str = CLAIM_BY_QUEUE
    enqueued: int = 0
    completed: int = 0
    insert_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def enqueue(self) -> None:
        async with connected(self.url) as conn:
            due = time.perf_counter()
            try:
                while not self.stop.is_set():
                    await conn.execute(
                        "INSERT INTO jobs (job_type, payload) VALUES ('noop', '{}')")
                    self.insert_ms.append((time.perf_counter() - due) * 1000)
                    self.enqueued += 1
                    due += 1 / self.rate
                    await asyncio.sleep(max(0.0, due - time.perf_counter()))
                    due = max(due, time.perf_counter() - 1 / self.rate)  # no catching up
            except Exception as exc:  # what a producer would have seen
                self.errors.append(f"enqueue: {exc!r}")

    async def work(self) -> None:
        async with connected(self.url) as conn:
            try:
                while not self.stop.is_set():
                    async with conn.transaction():
                        ids = await conn.fetch(self.claim)
                        await conn.execute(
                            "UPDATE jobs SET status = 'completed', completed_at = now() "
                            "WHERE id = ANY($1::uuid[])", [r["id"] for r in ids])
                    self.completed += len(ids)
                    await asyncio.sleep(0.005)
            except Exception as exc:
                self.errors.append(f"work: {exc!r}")

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Traffic]:
        tasks = [asyncio.create_task(self.enqueue()), asyncio.create_task(self.work())]
        await wait_for(lambda: self.enqueued > 0 and self.completed > 0, timeout=30,
                       message="the traffic to flow")
        try:
            yield self
        finally:
            self.stop.set()
            await asyncio.gather(*tasks)


class _Retries(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += getattr(record, "event", None) == "migration_retry"


async def migrate_under_traffic(url: str, *, rate: float = 500.0) -> dict[str, Any]:
    """`jobqueue migrate` to the newest revision on `url` (built at an older
    one) while `Traffic` runs: how long it took, how many times a revision
    gave up on a lock and was tried again, and what the producer saw."""
    from jobqueue.schema import migrations

    before = await migrations.current(url)
    retries = _Retries()
    logging.getLogger("jobqueue.migrations").addHandler(retries)
    traffic = Traffic(url, rate=rate)
    try:
        async with traffic.running():
            completed = traffic.completed
            started = time.monotonic()
            await migrations.upgrade(url)
            seconds = time.monotonic() - started
            worked = traffic.completed - completed
    finally:
        logging.getLogger("jobqueue.migrations").removeHandler(retries)
    inserts = sorted(traffic.insert_ms)
    return {"from": before, "to": await migrations.current(url), "seconds": seconds,
            "retries": retries.count, "rate": rate, "inserts": len(inserts),
            "insert_p50_ms": quantile(inserts, 0.5), "insert_p99_ms": quantile(inserts, 0.99),
            "insert_max_ms": inserts[-1], "completed_meanwhile": worked,
            "errors": "; ".join(traffic.errors)}
