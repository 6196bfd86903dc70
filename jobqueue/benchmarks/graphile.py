"""graphile-worker (Node.js) as a third peer of the comparison benchmark.

graphile-worker is the fastest published PostgreSQL job queue, so the
comparison is not complete without it. It is a Node.js package, not a Python
one: `install()` puts `graphile-worker@0.18.0` (exact) with npm into
`<checkout>/bench-results/graphile-worker/` (git-ignored), and `available()`
is False, with a one-line warning, where `node` or `npm` is missing. 0.18.0
declares `node >= 22.18`; it installs and runs on this machine's Node 20
(npm only warns), which is what the figures were measured with.

**Its own perfTest configuration.** graphile-worker's repository measures
itself with `perfTest/` (read at github.com/graphile/worker, main at
abfb4cf, after "v0.18.0 is pending"); this module runs the same options:

- `perfTest/run.js`: `PARALLELISM = 4` worker processes, each
  `node dist/cli.js --once` (drain what is runnable, then exit), with
  `NO_LOG_SUCCESS=1` in their environment (no log line per job); the schema
  installed by `cli.js --schema-only`; jobs queued beforehand in one call of
  the SQL function `graphile_worker.add_jobs(graphile_worker.job_spec[])`
  (`perfTest/init.js`).
- `perfTest/graphile.config.js`: `concurrentJobs: 24` (`CONCURRENT_JOBS`),
  `maxPoolSize: CONCURRENT_JOBS + 1` (25), `localQueue: {size: 500,
  refetchDelay: {durationMs: 10}}` (each process claims up to 500 jobs in one
  statement and hands them out from memory), `completeJobBatchDelay: 0` and
  `failJobBatchDelay: 0` (completions batched into one DELETE per tick),
  `gracefulShutdownAbortTimeout: 2500`, `fileExtensions: [".js", ".cjs",
  ".mjs"]`.
- Left at 0.18.0's defaults there (`dist/config.js`): `preparedStatements:
  true`, `pollInterval: 2000` (never reached by `--once`), `useNodeTime:
  false` (times come from the database's `now()`).

`drain(concurrency=…, workers=…)` changes only those two knobs, keeping
`maxPoolSize` at concurrency + 1 as perfTest derives it; concurrency defaults
to perfTest's 24, workers to 1 like the other peers' drains (perfTest runs
`PERFTEST_PROCESSES`, 4). Each run writes its preset to a `graphile.config.cjs`
of its own and passes it with `--config`. The tasks (`graphile_tasks/`) are
this project's: `noop` returns at once; `write_row` inserts one row into
`bench_rows` through `helpers.query`, the pool graphile-worker lends its tasks;
`process_payment` runs the seed's two statements (a balance UPDATE, a payment
INSERT) in one transaction on one client of that pool
(`helpers.withPgClient`, with BEGIN and COMMIT as node-postgres's docs show
a transaction).

**Timing.** graphile-worker deletes a job when it completes and keeps no log,
so unlike the other peers nothing records a completion time. The drain is
timed on the database's clock all the same, from outside, by one connection
of the benchmark process that samples graphile's jobs table every 10 ms
(`SAMPLE_INTERVAL`), each sample its own short autocommit statement (a
statement that stayed open would hold back the xmin horizon and slow
graphile's own scans of dead rows):

- Start: a claim sets `locked_at` to its statement's `now()` on every job it
  takes, so the first claim's time is read exactly from its jobs while they
  are still in the table. Only the first `add_jobs` chunk's rows are looked at
  (a primary-key range, ~2 ms for 10,000 rows, and only until the first claim
  is seen): every claim takes the earliest `run_at` first, and the first
  batches of up to 20 processes (500 jobs each) fit in that chunk. Should
  some of those jobs be gone already when the claim is first seen, the start
  is the last sample that saw the chunk untouched instead: then up to one
  sampling gap early.
- End: the first sample (its `clock_timestamp()`) that finds the table empty;
  the last completion committed between that sample and the one before. A
  primary-key probe, well under a millisecond.

So `seconds` runs from the first claim to within one sampling gap after the
last completion: never shorter than the drain, a little longer. The gap is
10 ms asked for, but the benchmark process competes for the CPU with the
workers and the server: on the 2-core machine the lab runs on, with 4 node
processes busy, consecutive samples came 13-17 ms apart at the median,
20-30 ms at p90, 30-55 ms at p99 and up to 120 ms at worst (over ten 2-3 s
drains); the last gap, the one that counts, was 13-43 ms. That is about
0.5-1.5 % of a 3 s drain (much more, relatively, of a smoke-size one), always
in the direction of a slower graphile-worker. Each drain logs its last gap at
DEBUG. Process start-up is not counted.

**Exactly once.** None of the n jobs may be left in the table (a failed job
stays there, for its retry, and graphile's "Failed task" line in a worker's
log fails the run too, so a job run again after a failure cannot pass). For
`write_row`, `bench_rows` must hold exactly n rows, for n distinct jobs, all
among the ids this drain queued: that also catches a job run twice without
failing. For `process_payment`, the payments and balances must add up as
`scenarios.check_writes` checks for every system (a payment run twice is
refused by its primary key, so it fails). A `noop` job repeated without
failing could not be seen (nothing records it); `write_row` is the check for
that.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import quote

import asyncpg

from jobqueue import db
from jobqueue.benchmarks import rss
from jobqueue.benchmarks.adapter import Drain, Peer, arguments, chunks, connect, processes
from jobqueue.benchmarks.peer_worker import WRITE_ROW
from jobqueue.testing import WorkerProcess

logger = logging.getLogger(__name__)

SYSTEM = "graphile-worker"
PACKAGE = "graphile-worker"
VERSION = "0.18.0"
CHECKOUT = Path(__file__).resolve().parents[2]
INSTALL_DIR = CHECKOUT / "bench-results" / "graphile-worker"
TASKS = Path(__file__).with_name("graphile_tasks")
SCHEMA = "graphile_worker"
JOBS = f"{SCHEMA}._private_jobs"
SAMPLE_INTERVAL = 0.01
INSTALL_TIMEOUT = 300.0

#: perfTest's numbers (`perfTest/graphile.config.js`, `perfTest/run.js`).
PERFTEST_CONCURRENCY = 24
PERFTEST_PROCESSES = 4
#: perfTest's preset, less what `drain` sets per run (concurrency, pool, tasks).
PERFTEST_OPTIONS: dict[str, Any] = {
    "fileExtensions": [".js", ".cjs", ".mjs"],
    "gracefulShutdownAbortTimeout": 2500,
    "localQueue": {"size": 500, "refetchDelay": {"durationMs": 10}},
    "completeJobBatchDelay": 0,
    "failJobBatchDelay": 0,
}
#: The `preset` column's name for perfTest's whole configuration.
PERFTEST = "perfTest"
#: perfTest's environment for its workers: no log line per completed job.
PERFTEST_ENV = {"NO_LOG_SUCCESS": "1"}


# -- installing ---------------------------------------------------------------------


def _installed_version(folder: Path) -> str | None:
    manifest = folder / "node_modules" / PACKAGE / "package.json"
    try:
        return str(json.loads(manifest.read_text())["version"])
    except (OSError, ValueError, KeyError):
        return None


def cli(folder: Path = INSTALL_DIR) -> Path:
    """graphile-worker's command-line entry point in an install folder."""
    return folder / "node_modules" / PACKAGE / "dist" / "cli.js"


def install(folder: Path = INSTALL_DIR) -> Path:
    """graphile-worker, pinned, installed by npm into `folder` unless it is
    there already (a file lock keeps two callers from installing at once);
    the folder. Raises RuntimeError with npm's output if npm fails."""
    if _installed_version(folder) == VERSION:
        return folder
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is not on PATH: cannot install graphile-worker")
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _installed_version(folder) == VERSION:
            return folder
        (folder / "package.json").write_text(json.dumps(
            {"name": "jobqueue-graphile-bench", "private": True,
             "dependencies": {PACKAGE: VERSION}}, indent=2) + "\n")
        logger.info("installing %s@%s into %s", PACKAGE, VERSION, folder)
        done = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--loglevel=error", "--save-exact"],
            cwd=folder, capture_output=True, text=True, timeout=INSTALL_TIMEOUT)
        if done.returncode != 0 or _installed_version(folder) != VERSION:
            raise RuntimeError(f"npm install {PACKAGE}@{VERSION} failed ({done.returncode}): "
                               f"{(done.stdout + done.stderr)[-2000:]}")
    return folder


def node_version() -> str | None:
    """`node --version` (v20.20.2), or None without node."""
    node = shutil.which("node")
    if node is None:
        return None
    done = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30)
    return done.stdout.strip() or None


def declared_node(folder: Path = INSTALL_DIR) -> str | None:
    """The Node versions the installed package declares (`engines.node` of
    its package.json), to set beside the one it ran on."""
    manifest = folder / "node_modules" / PACKAGE / "package.json"
    try:
        return str(json.loads(manifest.read_text())["engines"]["node"])
    except (OSError, ValueError, KeyError):
        return None


def available() -> bool:
    """Whether graphile-worker can run here: node and npm on PATH and the
    package installed (installing it now if need be). Otherwise False with a
    one-line warning, so the comparison skips it rather than failing."""
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        logger.warning("graphile-worker skipped: %s not on PATH", " and ".join(missing))
        return False
    try:
        install()
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        logger.warning("graphile-worker skipped: %s", str(e).splitlines()[0])
        return False
    return True


# -- connection strings and databases ------------------------------------------------


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


async def _node(folder: Path, args: Sequence[str], env: dict[str, str], cwd: Path,
                timeout: float = 120.0) -> None:
    """One short node command (the schema install); RuntimeError with its output."""
    proc = await asyncio.create_subprocess_exec(
        "node", str(cli(folder)), *args, cwd=cwd, env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"graphile-worker {' '.join(args)} exited with {proc.returncode}: "
                           f"{out.decode(errors='replace')[-2000:]}")


async def install_schema(url: str) -> None:
    """graphile-worker's schema, by graphile-worker itself (`--schema-only`, as perfTest does)."""
    folder = install()
    await _node(folder, ["--schema-only"], {"DATABASE_URL": node_conninfo(url)}, cwd=folder)


# -- filling --------------------------------------------------------------------------

#: graphile-worker's own batch API: `add_jobs(job_spec[])` (identifier,
#: payload, queue_name, run_at, max_attempts, job_key, priority, flags); the
#: NULLs take its defaults (payload `{}`, no queue, now, 25 attempts). $2 is
#: the chunk's payloads, in order (NULL: the default).
_ADD_JOBS = f"""
    SELECT min(id) AS first, max(id) AS last, count(*) AS added
    FROM {SCHEMA}.add_jobs(array(
        SELECT ROW($1::text, p, NULL, NULL, NULL, NULL, NULL, NULL)::{SCHEMA}.job_spec
        FROM unnest($2::json[]) WITH ORDINALITY AS u (p, i) ORDER BY i))"""


class Filled(NamedTuple):
    """The ids `fill` queued: all of them lie in [first, last]; the first
    chunk's, [first, first_chunk_last], are where the first claims land."""

    first: int
    first_chunk_last: int
    last: int


async def fill(url: str, n: int, handler: str) -> Filled:
    """n jobs of type `handler` queued with `add_jobs` in chunks
    (`adapter.FILL_CHUNK`) (`process_payment`'s payloads: `scenarios.payments`).
    Returns the ids queued (see `Filled`)."""
    if n < 1:
        raise ValueError("a drain needs at least one job")
    queued = []
    async with connect(url) as conn:
        for chunk in chunks([p if p is None else json.dumps(p) for p in arguments(n, handler)]):
            row = await conn.fetchrow(_ADD_JOBS, handler, chunk)
            if row["added"] != len(chunk):
                raise RuntimeError(f"add_jobs queued {row['added']} jobs, expected {len(chunk)}")
            queued.append((int(row["first"]), int(row["last"])))
    return Filled(queued[0][0], queued[0][1], queued[-1][1])


# -- draining -------------------------------------------------------------------------


def settings(workers: int, concurrency: int) -> str:
    """The label the tables show: the two knobs, and whether the whole setup
    is perfTest's."""
    whole = (workers, concurrency) == (PERFTEST_PROCESSES, PERFTEST_CONCURRENCY)
    rest = "perfTest configuration" if whole else "perfTest's other options"
    return f"concurrency {concurrency}, {processes(workers)}, {rest}"


def preset_options(concurrency: int) -> dict[str, Any]:
    """perfTest's preset with this run's concurrency (its pool, concurrency
    + 1, as perfTest derives it) and tasks."""
    return {**PERFTEST_OPTIONS, "concurrentJobs": concurrency,
            "maxPoolSize": concurrency + 1, "taskDirectory": str(TASKS)}


def knobs(worker: dict[str, Any]) -> list[str]:
    """The knobs a run turns, as `name=value` words read from the options its
    config file holds (the `argv` column; `peers.label` reads it back)."""
    return [f"{key}={worker[key]}" for key in ("concurrentJobs", "maxPoolSize")]


def write_config(path: Path, worker: dict[str, Any]) -> Path:
    """`worker` (`preset_options`) as a CommonJS graphile config file; the
    connection comes from DATABASE_URL."""
    path.write_text("// Written by jobqueue.benchmarks.graphile for one drain.\n"
                    f"module.exports = {{ worker: {json.dumps(worker, indent=2)} }};\n")
    return path


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


def _concurrency(args: list[str]) -> int:
    return int(dict(w.split("=", 1) for w in args)["concurrentJobs"])


def _worker(url: str, log: Path, args: list[str], drain: bool) -> WorkerProcess:
    """`graphile-worker --once` (drain what is runnable, then exit) with its
    options in a config file of the run's own, beside its log."""
    config = write_config(log.parent / "graphile.config.cjs", preset_options(_concurrency(args)))
    return WorkerProcess(node_conninfo(url), log, "node", str(cli(install())), "--once",
                         "--config", str(config), cwd=log.parent, command=("-c", rss.EXEC),
                         env=PERFTEST_ENV)


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
    available=available, versions=lambda: _versions() if available() else {})
