"""graphile-worker (Node.js), the fastest published PostgreSQL job queue, as
a peer: `graphile-worker@0.18.0` (exact) installed by npm into
`<checkout>/bench-results/graphile-worker/` (git-ignored), skipped with one
warning line without node or npm. 0.18.0 declares `node >= 22.18`; it
installs and runs on this machine's Node 20 (npm only warns), which is what
the figures were measured with.

**Its own perfTest configuration** (`perfTest/` in github.com/graphile/worker,
main at abfb4cf): 4 processes of `cli.js --once` (drain what is runnable,
then exit) with `NO_LOG_SUCCESS=1`, the schema by `cli.js --schema-only`,
jobs queued beforehand with `add_jobs(job_spec[])`, `PERFTEST_OPTIONS`,
`concurrentJobs: 24`, `maxPoolSize` concurrency + 1, the rest at 0.18.0's
defaults. A setup changes only the concurrency (the pool following it) and
the number of processes, written to a `graphile.config.cjs` of the run's
own. The tasks (`graphile_tasks/`) write through the pool graphile-worker
lends them (`process_payment`: one client, in BEGIN … COMMIT).

**Timing.** graphile-worker deletes a completed job and keeps no log, so
the drain is timed on the database's clock from outside, by one connection
sampling its jobs table every 10 ms (`SAMPLE_INTERVAL`; short autocommit
statements, so as not to hold back the xmin horizon). Start: the
`locked_at` a claim sets on the first `add_jobs` chunk's rows (every claim
takes the earliest first), or, should some be gone when a claim is first
seen, the last sample that saw the chunk untouched (up to one gap early).
End: the first sample that finds the table empty. So `seconds` is never
shorter than the drain; the last gap was 13-43 ms on the lab's 2-core
machine (0.5-1.5 % of a 3 s drain, always against graphile-worker), logged
at DEBUG.

**Exactly once.** No job may be left in the table (a failed one stays for
its retry) and no log may say "Failed task"; for `write_row`, `bench_rows`
must hold n rows of n distinct jobs all queued by this drain (which also
catches a job run twice without failing); payments are checked as for
every system (`scenarios.check_writes`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import quote

import asyncpg

from jobqueue import db
from jobqueue.benchmarks import adapter, rss, scenarios
from jobqueue.benchmarks.adapter import Drain, Peer
from jobqueue.benchmarks.peer_worker import WRITE_ROW
from jobqueue.testing import WorkerProcess

logger = logging.getLogger(__name__)

SYSTEM = "graphile-worker"
PACKAGE = "graphile-worker"
VERSION = "0.18.0"
INSTALL_DIR = Path(__file__).resolve().parents[2] / "bench-results" / "graphile-worker"
TASKS = Path(__file__).with_name("graphile_tasks")
SCHEMA = "graphile_worker"
JOBS = f"{SCHEMA}._private_jobs"
SAMPLE_INTERVAL = 0.01

PERFTEST_CONCURRENCY = 24
PERFTEST_PROCESSES = 4
#: perfTest's options, less what a run sets (concurrency, pool, tasks).
PERFTEST_OPTIONS: dict[str, Any] = {
    "fileExtensions": [".js", ".cjs", ".mjs"],
    "gracefulShutdownAbortTimeout": 2500,
    "localQueue": {"size": 500, "refetchDelay": {"durationMs": 10}},
    "completeJobBatchDelay": 0,
    "failJobBatchDelay": 0,
}
#: The `preset` column's name for perfTest's whole configuration.
PERFTEST = "perfTest"
PERFTEST_ENV = {"NO_LOG_SUCCESS": "1"}


def _manifest(folder: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((folder / "node_modules" / PACKAGE / "package.json").read_text()))
    except (OSError, ValueError):
        return {}


def cli(folder: Path = INSTALL_DIR) -> Path:
    """graphile-worker's command-line entry point in an install folder."""
    return folder / "node_modules" / PACKAGE / "dist" / "cli.js"


def install(folder: Path = INSTALL_DIR) -> Path:
    """graphile-worker, pinned, installed by npm into `folder` once."""
    def package_json() -> None:
        (folder / "package.json").write_text(json.dumps(
            {"name": "jobqueue-graphile-bench", "private": True,
             "dependencies": {PACKAGE: VERSION}}, indent=2) + "\n")

    return adapter.install_once(
        folder, lambda: _manifest(folder).get("version") == VERSION,
        [["npm", "install", "--no-audit", "--no-fund", "--loglevel=error", "--save-exact"]],
        timeout=300.0, before=package_json)


def node_version() -> str | None:
    """`node --version` (v20.20.2), or None without node."""
    if shutil.which("node") is None:
        return None
    return adapter.run(["node", "--version"], timeout=30).strip() or None


def declared_node(folder: Path = INSTALL_DIR) -> str | None:
    """The Node versions the installed package declares (`engines.node`)."""
    return _manifest(folder).get("engines", {}).get("node")


def available() -> bool:
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        logger.warning("graphile-worker skipped: %s not on PATH", " and ".join(missing))
        return False
    return adapter.can_install(SYSTEM, install)


def node_conninfo(url: str) -> str:
    """A SQLAlchemy URL as a libpq connection URI that node-postgres parses:
    a Unix-socket folder goes in the `host` query parameter."""
    args = db.asyncpg_connect_args(url)
    user = quote(str(args.get("user", "")), safe="")
    password = args.get("password")
    auth = f"{user}:{quote(str(password), safe='')}" if password is not None else user
    auth = f"{auth}@" if auth else ""
    database = quote(str(args.get("database", "")), safe="")
    host, port = str(args.get("host", "")), args.get("port")
    if host.startswith("/"):
        query = f"host={quote(host, safe='')}" + (f"&port={port}" if port else "")
        return f"postgresql://{auth}/{database}?{query}"
    netloc = f"{host}:{port}" if port else host
    return f"postgresql://{auth}{netloc}/{database}"


async def install_schema(url: str) -> None:
    folder = install()
    await asyncio.to_thread(adapter.run, ["node", str(cli(folder)), "--schema-only"], timeout=120,
                            cwd=folder, env={"DATABASE_URL": node_conninfo(url)})


#: Its own batch API, `add_jobs(job_spec[])` (identifier, payload, queue_name,
#: run_at, max_attempts, job_key, priority, flags), the NULLs its defaults.
_ADD_JOBS = f"""
    SELECT min(id) AS first, max(id) AS last, count(*) AS added
    FROM {SCHEMA}.add_jobs(array(
        SELECT ROW($1::text, p, NULL, NULL, NULL, NULL, NULL, NULL)::{SCHEMA}.job_spec
        FROM unnest($2::json[]) WITH ORDINALITY AS u (p, i) ORDER BY i))"""


class Filled(NamedTuple):
    """The ids `fill` queued: all in [first, last]; the first chunk's,
    [first, first_chunk_last], are where the first claims land."""

    first: int
    first_chunk_last: int
    last: int


async def fill(url: str, n: int, handler: str) -> Filled:
    if n < 1:
        raise ValueError("a drain needs at least one job")
    queued = []
    async with scenarios.connected(url) as conn:
        for chunk in adapter.chunks([p if p is None else json.dumps(p)
                                     for p in adapter.arguments(n, handler)]):
            row = await conn.fetchrow(_ADD_JOBS, handler, chunk)
            if row["added"] != len(chunk):
                raise RuntimeError(f"add_jobs queued {row['added']} jobs, expected {len(chunk)}")
            queued.append((int(row["first"]), int(row["last"])))
    return Filled(queued[0][0], queued[0][1], queued[-1][1])


def settings(workers: int, concurrency: int) -> str:
    """The label the tables show: the two knobs, and whether the whole setup
    is perfTest's."""
    whole = (workers, concurrency) == (PERFTEST_PROCESSES, PERFTEST_CONCURRENCY)
    rest = "perfTest configuration" if whole else "perfTest's other options"
    return f"concurrency {concurrency}, {adapter.processes(workers)}, {rest}"


def preset_options(concurrency: int) -> dict[str, Any]:
    return {**PERFTEST_OPTIONS, "concurrentJobs": concurrency,
            "maxPoolSize": concurrency + 1, "taskDirectory": str(TASKS)}


def knobs(worker: dict[str, Any]) -> list[str]:
    """The knobs a run turns, as `name=value` words (its `argv`)."""
    return [f"{key}={worker[key]}" for key in ("concurrentJobs", "maxPoolSize")]


def _concurrency(args: list[str]) -> int:
    return int(dict(w.split("=", 1) for w in args)["concurrentJobs"])


def _worker(url: str, log: Path, args: list[str], drain: bool) -> WorkerProcess:
    """`graphile-worker --once` with its options in a config file of the
    run's own, beside its log; the connection from DATABASE_URL."""
    config = log.parent / "graphile.config.cjs"
    options = json.dumps(preset_options(_concurrency(args)), indent=2)
    config.write_text(f"module.exports = {{ worker: {options} }};\n")
    return WorkerProcess(node_conninfo(url), log, "node", str(cli(install())), "--once",
                         "--config", str(config), cwd=log.parent, command=("-c", rss.EXEC),
                         env=PERFTEST_ENV)


_FIRST_CLAIM = f"""
    SELECT extract(epoch FROM clock_timestamp()) AS now,
           extract(epoch FROM min(locked_at)) AS claimed, count(*) AS remaining
    FROM {JOBS} WHERE id BETWEEN $1 AND $2"""
_EMPTY = f"""
    SELECT extract(epoch FROM clock_timestamp()) AS now,
           (SELECT id FROM {JOBS} ORDER BY id LIMIT 1) IS NULL AS empty"""


async def _watch(conn: asyncpg.Connection, filled: Filled,
                 procs: Sequence[WorkerProcess]) -> tuple[float | None, float | None]:
    """The first claim and the moment the table was first seen empty, on the
    database's clock (None if the processes all exited before either)."""
    lo, hi = filled.first, filled.first_chunk_last
    size = hi - lo + 1
    untouched: float | None = None  # the last sample that saw no claim yet
    first: float | None = None

    def exited() -> bool:
        return all(p.proc.poll() is not None for p in procs)

    while first is None:
        gone = exited()
        row = await conn.fetchrow(_FIRST_CLAIM, lo, hi)
        if row["remaining"] < size:  # some already completed: bounded from below
            first = untouched if untouched is not None else float(row["now"])
            logger.debug("first claim bounded by a sample (%s)", first)
        elif row["claimed"] is not None:
            first = float(row["claimed"])
        else:
            untouched = float(row["now"])
            if gone:
                return None, None
            await asyncio.sleep(SAMPLE_INTERVAL)
    busy = first
    while True:
        gone = exited()
        row = await conn.fetchrow(_EMPTY)
        if row["empty"]:
            logger.debug("drain end seen within %.1f ms of the last completion",
                         (float(row["now"]) - busy) * 1000)
            return float(first), float(row["now"])
        if gone:
            return float(first), None
        busy = float(row["now"])
        await asyncio.sleep(SAMPLE_INTERVAL)


async def _check(conn: asyncpg.Connection, n: int, handler: str, filled: Filled,
                 procs: Sequence[WorkerProcess]) -> None:
    """RuntimeError unless every job ran exactly once (see the module's docstring)."""
    left = await conn.fetchval(f"SELECT count(*) FROM {JOBS}")
    failed = [p.log_path.name for p in procs if "Failed task" in p.log()]
    if left or failed:
        raise RuntimeError(f"{SYSTEM} did not complete every job: {left} of {n} left in "
                           f"{JOBS}; failures logged in {failed or 'no log'}")
    written = await conn.fetchrow(
        "SELECT count(*) AS rows, count(DISTINCT job_id) AS jobs,"
        " count(*) FILTER (WHERE job_id NOT BETWEEN $1 AND $2) AS strays FROM bench_rows",
        filled.first, filled.last)
    expected = n if handler == WRITE_ROW else 0
    if (written["rows"], written["jobs"], written["strays"]) != (expected, expected, 0):
        raise RuntimeError(f"{SYSTEM} lost or repeated jobs: {written['rows']} rows written "
                           f"for {written['jobs']} distinct jobs ({written['strays']} not "
                           f"queued by this drain), expected {expected}")


async def drained(run: Drain) -> tuple[float, float]:
    """The processes' exit, timed from outside (`_watch`), every job checked."""
    watch = asyncio.create_task(_watch(run.conn, run.filled, run.procs))
    try:
        await asyncio.gather(*(p.finish(run.timeout) for p in run.procs))
        first, last = await asyncio.wait_for(watch, run.timeout)
    finally:
        if not watch.done():
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
    await _check(run.conn, run.n, run.handler, run.filled, run.procs)
    if first is None or last is None:
        raise RuntimeError(f"{SYSTEM}'s drain was not seen to start and end "
                           f"(logs in {run.procs[0].log_path.parent})")
    return first, last


def _versions() -> dict[str, str]:
    return {f"{SYSTEM}_version": VERSION, "node": node_version() or "?"}


PEER = Peer(
    system=SYSTEM,
    label=lambda args, workers: settings(workers, _concurrency(args)),
    argv=lambda setup, handler: knobs(preset_options(
        int(setup.get("concurrency", PERFTEST_CONCURRENCY)))),
    install=install_schema, truncate=f"TRUNCATE {JOBS}",
    tables=(JOBS, f"{SCHEMA}._private_tasks", f"{SCHEMA}._private_job_queues"),
    fill=fill, worker=_worker, drained=drained,
    columns=lambda args: {"batch_size": None, "concurrency": _concurrency(args)},
    preset=lambda args, workers: PERFTEST if workers == PERFTEST_PROCESSES and args == knobs(
        preset_options(PERFTEST_CONCURRENCY)) else "",
    available=available, versions=lambda: _versions() if available() else {},
    recommended=(
        "Its performance page: batching (a local queue, completions batched) for any "
        "high-throughput queue, and perfTest, its own benchmark: 4 processes of 24 concurrent "
        "jobs each, a pool of 25, a local queue of 500, `completeJobBatchDelay` and "
        "`failJobBatchDelay` 0, tuned for an i9-14900K.",
        (("performance", "https://worker.graphile.org/docs/performance"),
         ("config", "https://worker.graphile.org/docs/config"))))
