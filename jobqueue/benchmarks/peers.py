"""jobqueue beside its peers: PgQueuer, Procrastinate, graphile-worker
(`graphile`, a Node.js package) and the course's design, measured the same
way on the same server, one after another in one run.

Each peer gets a database of its own (`jobqueue_bench_<name>`) with its schema
installed through its own API, and runs as a real worker process
(`peer_worker.py`) configured the way its documentation advises. The figures
come from the timestamps each system records in its own tables, on the
database's clock, as jobqueue's do:

| system | enqueued | started (claimed) | completion recorded |
|---|---|---|---|
| jobqueue | `jobs.created_at` | `jobs.started_at` | `jobs.completed_at` |
| PgQueuer | `pgqueuer_log` row `queued` | row `picked` | row `successful` |
| Procrastinate | `procrastinate_events` `deferred` | `started` | `succeeded` |

PgQueuer deletes a finished job from its queue table, so its log is the only
record; Procrastinate keeps its jobs (its default `delete_jobs="never"`) and
writes an event row per transition from triggers. Every one of these is the
time of the statement that makes the change; its commit follows within about
a millisecond.

Three measurements, each returning plain rows like `scenarios.drain` and
`scenarios.open_loop` plus `system` and `settings` columns:

- `drain`: N jobs already queued, W worker processes; throughput from the
  first claim to the last recorded completion, every job checked done, each
  process's resident memory sampled (`rss`). The jobs are no-ops, or do real
  work: `write_row` (one INSERT) or `process_payment` (the seed's UPDATE of a
  balance and INSERT of a payment, in one transaction), each peer's task
  writing the way its docs show (`peer_worker`); every job's rows are checked
  (`scenarios.check_writes`).
- `open_loop`: jobs enqueued one by one, each in its own transaction, at
  scheduled times, over an asyncpg pool: PgQueuer's own `Queries.enqueue`,
  Procrastinate's own defer statement (the SQL function `Task.defer_async`
  calls), jobqueue's plain INSERT; one idle worker. Latency from enqueue to
  start and to completion recorded.
- `memory_timeline`: one worker draining a big table, its RSS over time.

`drain_comparison`, `latency_comparison` and `memory_comparison` run a list of
setups (dicts: `{"system": "pgqueuer", "batch_size": 500, "workers": 2}`) for
the notebook, jobqueue and the course's design included. A jobqueue setup is
the worker's command line: `{"system": "jobqueue", "flags": [], "workers": 1}`
is `jobqueue worker --import MODULE` exactly as the README starts it
(`scenarios.cli_drain`); its label is built from those arguments
(`scenarios.worker_label`). A setup may carry its own `n` (Procrastinate's
few hundred jobs/s want a smaller drain than the others); every row says
which n it drained.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import shlex
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import asyncpg

from jobqueue import db, embedded
from jobqueue.benchmarks import graphile, rss, scenarios
from jobqueue.benchmarks.peer_worker import HANDLERS, NOOP, PEER_BENCH_TABLE, PROCESS_PAYMENT
from jobqueue.benchmarks.quick import check_bench_name
from jobqueue.testing import WorkerProcess, wait_for

logger = logging.getLogger(__name__)

PEER_WORKER = Path(__file__).with_name("peer_worker.py")
GRAPHILE = graphile.SYSTEM
SYSTEMS = ("jobqueue", "pgqueuer", "procrastinate", GRAPHILE, "course design")
PEERS = ("pgqueuer", "procrastinate", GRAPHILE)
FILL_CHUNK = 10_000
#: What each Python peer package is called, for its version in the results.
PACKAGES = {"pgqueuer": "pgqueuer", "procrastinate": "procrastinate"}


def available(system: str) -> bool:
    """Whether a peer can run here: a Python peer installed (`make setup`
    installs the `peers` extra), graphile-worker with node and npm on PATH
    (`graphile.available`, one warning line otherwise); jobqueue and the
    course's design always."""
    if system == GRAPHILE:
        return graphile.available()
    package = PACKAGES.get(system)
    return package is None or importlib.util.find_spec(package) is not None


def versions() -> dict[str, str]:
    """The installed peers' versions, for the results files' header."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for system, package in PACKAGES.items():
        with contextlib.suppress(PackageNotFoundError):
            found[f"{system}_version"] = version(package)
    if graphile.available():
        found[f"{GRAPHILE}_version"] = graphile.VERSION
        found["node"] = graphile.node_version() or "?"
    return found


def libpq_env(url: str) -> dict[str, str]:
    """The database as libpq environment variables, which both asyncpg and
    psycopg read: the peer worker process needs no URL parser of ours."""
    args = db.asyncpg_connect_args(url)
    names = {"host": "PGHOST", "port": "PGPORT", "user": "PGUSER",
             "password": "PGPASSWORD", "database": "PGDATABASE"}
    return {names[k]: str(v) for k, v in args.items() if k in names}


def conninfo(url: str) -> str:
    """A libpq connection string for psycopg (Procrastinate's driver)."""
    from psycopg.conninfo import make_conninfo

    args = db.asyncpg_connect_args(url)
    if "database" in args:
        args["dbname"] = args.pop("database")
    return make_conninfo(**{k: str(v) for k, v in args.items() if k != "ssl"})


# -- each peer's own API: schema, reset, fill, producer, figures -------------------


class _Peer:
    """What differs between peers; everything else is shared below."""

    system: str
    truncate: str
    vacuum: tuple[str, ...]
    #: The table of per-job events: (table, time column, kind column), and the
    #: kinds that mean enqueued, started (claimed) and completed.
    events: tuple[str, str, str]
    kinds: tuple[str, str, str]
    drain_sql: str
    completed_sql: str

    @property
    def latency_sql(self) -> str:
        """Each job's three times (epoch seconds), for jobs after id $1."""
        table, at, kind = self.events
        times = ", ".join(
            f"extract(epoch FROM min({at}) FILTER (WHERE {kind} = '{k}')) AS {name}"
            for name, k in zip(("enqueued", "started", "completed"), self.kinds, strict=True))
        return f"SELECT job_id AS id, {times} FROM {table} WHERE job_id > $1 GROUP BY job_id"

    async def install(self, url: str) -> None:
        raise NotImplementedError

    async def enqueue_many(self, url: str, n: int, handler: str) -> None:
        """n jobs of type `handler` through the peer's own batch API, chunk by chunk."""
        raise NotImplementedError

    def enqueue_one(self, pool: asyncpg.Pool) -> Callable[[], Awaitable[Any]]:
        """One job in its own transaction on `pool`; returns its id."""
        raise NotImplementedError

    def worker_args(self, setup: Mapping[str, Any]) -> list[str]:
        raise NotImplementedError

    async def fill(self, url: str, n: int, handler: str) -> None:
        """`enqueue_many`, then VACUUM ANALYZE so every run starts alike."""
        await self.enqueue_many(url, n, handler)
        conn = await db.connect(url, application_name="jobqueue bench")
        try:
            for table in self.vacuum:
                await conn.execute(f"VACUUM ANALYZE {table}")
        finally:
            await conn.close()

    async def _tables(self, conn: asyncpg.Connection) -> None:
        """The tables the tasks write, beside the peer's own schema."""
        await conn.execute(PEER_BENCH_TABLE)
        await scenarios.create_demo_tables(conn)

    @contextlib.asynccontextmanager
    async def producer(self, url: str, connections: int
                       ) -> AsyncIterator[Callable[[], Awaitable[Any]]]:
        """`enqueue_one` over an asyncpg pool: the same client for every system."""
        pool = await asyncpg.create_pool(**db.asyncpg_connect_args(url), min_size=connections,
                                         max_size=connections)
        try:
            yield self.enqueue_one(pool)
        finally:
            await pool.close()


class _PgQueuer(_Peer):
    """PgQueuer: installed with `Queries.install()` (what `pgq install` runs)
    at its default durability, `durable` (every table logged, as jobqueue's),
    then `Queries.optimize_autovacuum()` (`pgq autovac`, which its performance
    guide says to run after installing)."""

    system = "pgqueuer"
    truncate = "TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics"
    vacuum = ("pgqueuer", "pgqueuer_log")
    drain_sql = """
        SELECT count(*) FILTER (WHERE status = 'successful') AS completed,
               count(DISTINCT job_id) FILTER (WHERE status = 'successful') AS distinct_completed,
               count(*) FILTER (WHERE status = 'queued') AS total,
               (SELECT count(*) FROM pgqueuer) AS left_in_queue,
               extract(epoch FROM min(created) FILTER (WHERE status = 'picked')) AS first,
               extract(epoch FROM max(created) FILTER (WHERE status = 'successful')) AS last
        FROM pgqueuer_log"""
    events = ("pgqueuer_log", "created", "status")
    kinds = ("queued", "picked", "successful")
    completed_sql = "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful' AND job_id > $1"

    async def install(self, url: str) -> None:
        from pgqueuer import Queries

        conn = await db.connect(url, application_name="jobqueue bench")
        try:
            queries = Queries.from_asyncpg_connection(conn)
            await queries.install()
            await queries.optimize_autovacuum()
            await self._tables(conn)
        finally:
            await conn.close()

    async def enqueue_many(self, url: str, n: int, handler: str) -> None:
        """`Queries.enqueue` with lists (one statement per chunk), so the queue
        and its log hold exactly what its producers would write."""
        from pgqueuer import Queries

        payloads: list[bytes | None] = (
            [json.dumps(p).encode() for p in scenarios.payments(n)]
            if handler == PROCESS_PAYMENT else [None] * n)
        conn = await db.connect(url, application_name="jobqueue bench")
        try:
            queries = Queries.from_asyncpg_connection(conn)
            for start in range(0, n, FILL_CHUNK):
                count = min(FILL_CHUNK, n - start)
                await queries.enqueue([handler] * count, payloads[start:start + count],
                                      [0] * count)
        finally:
            await conn.close()

    def enqueue_one(self, pool: asyncpg.Pool) -> Callable[[], Awaitable[Any]]:
        """`Queries.enqueue(entrypoint, payload)` on a pool, as its guide
        advises for producers."""
        from pgqueuer import Queries

        queries = Queries.from_asyncpg_pool(pool)
        return lambda: queries.enqueue(NOOP, None)

    def worker_args(self, setup: Mapping[str, Any]) -> list[str]:
        return ["--batch-size", str(setup.get("batch_size", 10))]


class _Procrastinate(_Peer):
    """Procrastinate: installed with `SchemaManager.apply_schema_async()` (what
    `procrastinate schema --apply` runs); the psycopg connector, which its
    docs use throughout; an async no-op task."""

    system = "procrastinate"
    truncate = ("TRUNCATE procrastinate_jobs, procrastinate_events, "
                "procrastinate_periodic_defers, procrastinate_workers")
    vacuum = ("procrastinate_jobs", "procrastinate_events")
    drain_sql = """
        SELECT count(*) FILTER (WHERE status = 'succeeded') AS completed,
               count(*) FILTER (WHERE status = 'succeeded') AS distinct_completed,
               count(*) AS total,
               count(*) FILTER (WHERE status IN ('todo', 'doing')) AS left_in_queue,
               (SELECT extract(epoch FROM min(at)) FROM procrastinate_events
                 WHERE type = 'started') AS first,
               (SELECT extract(epoch FROM max(at)) FROM procrastinate_events
                 WHERE type = 'succeeded') AS last
        FROM procrastinate_jobs"""
    events = ("procrastinate_events", "at", "type")
    kinds = ("deferred", "started", "succeeded")
    completed_sql = ("SELECT count(*) FROM procrastinate_jobs"
                     " WHERE status = 'succeeded' AND id > $1")
    defer_sql = ("SELECT unnest(procrastinate_defer_jobs_v1(ARRAY[ROW('default', 'noop', 0,"
                 " NULL, NULL, '{}'::jsonb, NULL)::procrastinate_job_to_defer_v1]))")

    @contextlib.asynccontextmanager
    async def _app(self, url: str, pool: int) -> AsyncIterator[Any]:
        from jobqueue.benchmarks.peer_worker import procrastinate_app

        app = procrastinate_app(max(pool - 1, 1), conninfo(url))
        async with app.open_async():
            yield app

    async def install(self, url: str) -> None:
        async with self._app(url, 2) as app:
            await app.schema_manager.apply_schema_async()
        conn = await db.connect(url, application_name="jobqueue bench")
        try:
            await self._tables(conn)
        finally:
            await conn.close()

    async def enqueue_many(self, url: str, n: int, handler: str) -> None:
        """`Task.batch_defer_async` (one statement per chunk)."""
        arguments = scenarios.payments(n) if handler == PROCESS_PAYMENT else [{}] * n
        async with self._app(url, 2) as app:
            task = app.tasks[handler]
            for start in range(0, n, FILL_CHUNK):
                await task.batch_defer_async(*arguments[start:start + FILL_CHUNK])

    def enqueue_one(self, pool: asyncpg.Pool) -> Callable[[], Awaitable[Any]]:
        """The statement `Task.defer_async()` sends (its `defer_jobs` query:
        Procrastinate's own SQL function), on an asyncpg pool like the other
        systems' producers. Through `defer_async` itself (psycopg and
        Procrastinate's Python around it) one producer reached only about 530
        of 1,000 jobs/s here while the worker shared the two cores, so the rate
        asked for would not have been the rate measured."""
        return lambda: pool.fetchval(self.defer_sql)

    def worker_args(self, setup: Mapping[str, Any]) -> list[str]:
        return ["--concurrency", str(setup.get("concurrency", 1))]


_PEERS: dict[str, _Peer] = {"pgqueuer": _PgQueuer(), "procrastinate": _Procrastinate()}


def _peer(system: str) -> _Peer:
    if system not in _PEERS:
        raise ValueError(f"unknown Python peer {system!r}; one of {sorted(_PEERS)}")
    if not available(system):
        raise ModuleNotFoundError(f"{system} is not installed: `make setup` installs the "
                                  "`peers` extra (pip install -e '.[peers]')")
    return _PEERS[system]


# -- databases -------------------------------------------------------------------


async def open_peer(system: str, name: str) -> str:
    """A database of the peer's own (`jobqueue_bench_<name>`, replacing any
    leftover) with its schema installed through its own API (graphile-worker:
    its CLI, `graphile.open_graphile`) and the tables the tasks write; its
    URL. Pair with `scenarios.close_bench(name)`."""
    if system == GRAPHILE:
        return await graphile.open_graphile(name)
    peer = _peer(system)
    database = check_bench_name(f"{scenarios.LAB_DATABASE_PREFIX}{name}")
    url = await db.create_database(embedded.database_url(), database, replace=True)
    await peer.install(url)
    logger.info("%s installed in %s", system, database)
    return url


@contextlib.asynccontextmanager
async def peer_database(system: str, name: str) -> AsyncIterator[str]:
    """`open_peer` and `scenarios.close_bench` as a context manager."""
    url = await open_peer(system, name)
    try:
        yield url
    finally:
        await scenarios.close_bench(name)


async def _reset(url: str, peer: _Peer, handler: str) -> None:
    conn = await db.connect(url, application_name="jobqueue bench")
    try:
        await conn.execute(peer.truncate)
        await scenarios.reset_writes(conn, handler)
    finally:
        await conn.close()


async def fill(system: str, url: str, n: int, handler: str = NOOP) -> None:
    """Empty the peer's tables and what the tasks write, then queue n jobs of
    type `handler` (`noop`, `write_row`, `process_payment` with
    `scenarios.payments` as arguments) through its own batch API and VACUUM
    ANALYZE, so every run starts from the same state."""
    if handler not in HANDLERS:
        raise ValueError(f"unknown peer handler {handler!r}; one of {HANDLERS}")
    peer = _peer(system)
    await _reset(url, peer, handler)
    await peer.fill(url, n, handler)


def _process(url: str, system: str, log: Path, *args: str) -> WorkerProcess:
    return WorkerProcess(url, log, *args, command=("-P", str(PEER_WORKER), system),
                         env=libpq_env(url))


# -- setups and their labels -------------------------------------------------------


def jobqueue_flags(setup: Mapping[str, Any]) -> list[str]:
    """A jobqueue setup's worker flags: its `flags`, or the knobs it names
    (`batch_size`, `concurrency`, `shared`) as flags; none means the CLI's
    defaults."""
    if "flags" in setup:
        return [str(f) for f in setup["flags"]]
    flags = []
    for key, flag in (("batch_size", "--batch-size"), ("concurrency", "--concurrency")):
        if key in setup:
            flags += [flag, str(setup[key])]
    return flags + (["--shared"] if setup.get("shared") else [])


def _graphile_concurrency(setup: Mapping[str, Any]) -> int:
    return int(setup.get("concurrency", graphile.PERFTEST_CONCURRENCY))


def settings(setup: Mapping[str, Any], handler: str = NOOP) -> str:
    """A setup as the tables show it: the knobs that were turned (for
    jobqueue, the label `scenarios.worker_label` builds from the command line
    the setup gives its workers)."""
    system = setup["system"]
    workers = int(setup.get("workers", 1))
    procs = f"{workers} process{'es' if workers > 1 else ''}"
    if system == "jobqueue":
        argv = scenarios.worker_argv(handler, *jobqueue_flags(setup))
        return scenarios.worker_label(argv, workers)
    if system == "pgqueuer":
        return f"batch {setup.get('batch_size', 10)}, {procs}"
    if system == "procrastinate":
        return f"concurrency {setup.get('concurrency', 1)}, {procs}"
    if system == GRAPHILE:
        return graphile.settings(workers, _graphile_concurrency(setup))
    if system == "course design":
        return "a transaction per job, ORM, in-process"
    raise ValueError(f"unknown system {system!r}; one of {SYSTEMS}")


#: The `preset` column's names for the two setups the findings single out.
CLI_DEFAULTS = "CLI defaults"
PERFTEST = "perfTest"


def preset(setup: Mapping[str, Any]) -> str:
    """`CLI_DEFAULTS` for jobqueue started with no flag, `PERFTEST` for
    graphile-worker in its perfTest configuration (processes and concurrency
    both perfTest's), else empty."""
    system, workers = setup["system"], int(setup.get("workers", 1))
    if system == "jobqueue" and not jobqueue_flags(setup) and workers == 1:
        return CLI_DEFAULTS
    if system == GRAPHILE and (workers, _graphile_concurrency(setup)) == (
            graphile.PERFTEST_PROCESSES, graphile.PERFTEST_CONCURRENCY):
        return PERFTEST
    return ""


# -- drain -------------------------------------------------------------------------


async def drain(system: str, url: str, *, n: int, workers: int = 1, batch_size: int = 10,
                concurrency: int = 1, handler: str = NOOP, timeout: float = 900.0,
                log_dir: Path | None = None) -> dict[str, Any]:
    """One drain of a Python peer: fill n jobs of type `handler`, start
    `workers` worker processes in the peer's drain mode, wait for them to
    exit; throughput from the first claim to the last completion the peer
    recorded, and each process's RSS. Raises RuntimeError unless every job
    completed exactly once and wrote exactly its rows
    (`scenarios.check_writes`)."""
    row, _ = await _drain(system, url, n=n, workers=workers, batch_size=batch_size,
                          concurrency=concurrency, handler=handler, timeout=timeout,
                          log_dir=log_dir)
    return row


async def _drain(system: str, url: str, *, n: int, workers: int, batch_size: int,
                 concurrency: int, handler: str, timeout: float, log_dir: Path | None
                 ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    peer = _peer(system)
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix=f"{system}-drain-"))
    setup = {"system": system, "workers": workers, "batch_size": batch_size,
             "concurrency": concurrency}
    await fill(system, url, n, handler)
    args = [*peer.worker_args(setup), "--drain"]
    procs = [_process(url, system, log_dir / f"drain-{i}.log", *args) for i in range(workers)]
    try:
        async with rss.RssSampler(p.pid for p in procs) as sampler:
            for p in procs:
                await p.finish(timeout)
        conn = await db.connect(url, application_name="jobqueue bench")
        try:
            row = await conn.fetchrow(peer.drain_sql)
            if (row["completed"], row["distinct_completed"], row["total"],
                    row["left_in_queue"]) != (n, n, n, 0):
                raise RuntimeError(
                    f"{system} lost or repeated jobs: {row['completed']} completions of "
                    f"{row['distinct_completed']} distinct jobs, {row['total']} queued, "
                    f"{row['left_in_queue']} left, expected {n}")
            await scenarios.check_writes(conn, handler, n, system)
        finally:
            await conn.close()
    finally:
        for p in procs:
            p.close()
    first, last = float(row["first"]), float(row["last"])
    seconds = last - first
    result = {"system": system, "settings": settings(setup), "n": n, "workers": workers,
              "batch_size": batch_size if system == "pgqueuer" else None,
              "concurrency": concurrency if system == "procrastinate" else None,
              "handler": handler, "seconds": seconds, "jobs_per_sec": n / seconds,
              **rss.summary(sampler.samples, first, last)}
    return result, rss.timeline(sampler.samples, first)


async def memory_timeline(system: str, url: str, *, n: int, batch_size: int = 10,
                          concurrency: int = 1, timeout: float = 3600.0) -> dict[str, Any]:
    """One worker of a peer draining n jobs, its RSS sampled over time (as
    `scenarios.memory_timeline`)."""
    row, timeline = await _drain(system, url, n=n, workers=1, batch_size=batch_size,
                                 concurrency=concurrency, handler=NOOP, timeout=timeout,
                                 log_dir=None)
    return {"summary": row, "timeline": timeline}


# -- latency -----------------------------------------------------------------------


async def open_loop(system: str, url: str, *, rate: float, seconds: float,
                    batch_size: int = 10, concurrency: int = 1, connections: int = 8,
                    log_dir: Path | None = None) -> dict[str, Any]:
    """Arrivals at `rate` jobs/s for `seconds`, each enqueued in its own
    transaction at its scheduled time (see each peer's `producer`); one idle
    worker process (continuous mode, woken by its LISTEN/NOTIFY). A warm-up
    job, not counted, proves the worker is up before the clock starts.
    Returns what `scenarios.open_loop` returns, with `system` and `settings`
    in the summary."""
    peer = _peer(system)
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix=f"{system}-latency-"))
    setup = {"system": system, "batch_size": batch_size, "concurrency": concurrency}
    await fill(system, url, 0)
    total = max(1, round(rate * seconds))
    worker = _process(url, system, log_dir / "worker.log", *peer.worker_args(setup))
    conn = await db.connect(url, application_name="jobqueue bench")
    try:
        async with peer.producer(url, connections) as enqueue_one:
            warm = await enqueue_one()
            warm_id = warm[0] if isinstance(warm, list) else warm
            await wait_for(lambda: _completed(conn, peer, warm_id - 1, 1, worker),
                           timeout=60, message=f"{system}'s worker to finish a warm-up job")
            lateness = await scenarios.arrivals(enqueue_one, rate, total)
        await wait_for(lambda: _completed(conn, peer, warm_id, total, worker),
                       timeout=seconds + 120, interval=0.05, message="every job completed")
        rows = await conn.fetch(peer.latency_sql, warm_id)
    finally:
        await worker.stop()
        await conn.close()
    enqueued = sorted(float(r["enqueued"]) for r in rows)
    span = enqueued[-1] - enqueued[0] if len(enqueued) > 1 else 0.0
    to_start = [float(r["started"]) - float(r["enqueued"]) for r in rows]
    to_complete = [float(r["completed"]) - float(r["enqueued"]) for r in rows]
    result = scenarios.latency_result(rate, seconds, span, lateness, to_start, to_complete)
    result["summary"] = {"system": system, "settings": settings(setup), **result["summary"]}
    return result


async def _completed(conn: asyncpg.Connection, peer: _Peer, after_id: int, count: int,
                     worker: WorkerProcess) -> bool:
    if worker.proc.poll() is not None:
        raise RuntimeError(f"{peer.system} worker exited: {worker.log()[-2000:]}")
    return bool(await conn.fetchval(peer.completed_sql, after_id) >= count)


# -- the comparison: setups run one after another, repeated --------------------------


def _runnable(setups: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The setups whose system can run here; one warning per missing system
    (graphile-worker's `available` says itself what it lacks)."""
    can = {system: available(system) for system in dict.fromkeys(s["system"] for s in setups)}
    for system, ok in can.items():
        if not ok and system != GRAPHILE:
            logger.warning("%s is not installed (`make setup` installs the peers): skipped",
                           system)
    return [s for s in setups if can[s["system"]]]


async def drain_setup(urls: Mapping[str, str], setup: Mapping[str, Any], *, n: int,
                      handler: str = NOOP) -> dict[str, Any]:
    """One drain of any system, `setup.get("n", n)` jobs of type `handler`:
    jobqueue (`scenarios.cli_drain`: its CLI with the setup's flags, RSS
    sampled), a Python peer (`drain`), graphile-worker (`graphile.drain`) or
    the course's design (no-op jobs only; in this process, timed by its own
    client clock: it has no worker process of its own)."""
    system = setup["system"]
    n = int(setup.get("n", n))
    workers = int(setup.get("workers", 1))
    label = {"system": system, "settings": settings(setup, handler), "preset": preset(setup)}
    if system == "jobqueue":
        row = await scenarios.cli_drain(urls["jobqueue"], n=n, handler=handler,
                                        flags=jobqueue_flags(setup), workers=workers)
    elif system == "course design":
        if handler != NOOP:
            raise ValueError("the course design runs no-op jobs only")
        (row,) = await scenarios.course_drains(urls["jobqueue"], n=n, repeat=1)
        row.pop("run", None)
        row["workers"] = 1
    elif system == GRAPHILE:
        row = await graphile.drain(urls[GRAPHILE], n=n, workers=workers, handler=handler,
                                   concurrency=_graphile_concurrency(setup))
    else:
        row = await drain(system, urls[system], n=n, workers=workers, handler=handler,
                          batch_size=int(setup.get("batch_size", 10)),
                          concurrency=int(setup.get("concurrency", 1)))
    return {**row, **label}


async def drain_comparison(urls: Mapping[str, str], setups: Sequence[Mapping[str, Any]], *,
                           n: int, repeat: int, handler: str = NOOP) -> list[dict[str, Any]]:
    """Every setup drains n jobs of type `handler` (or the setup's own `n`),
    `repeat` rounds; within a round the setups run one after another, so a
    slow spell of the machine hits them all rather than one system's runs."""
    setups = _runnable(setups)
    rows = []
    with scenarios.progress(len(setups) * repeat, f"drain ({handler})") as bar:
        for run in range(1, repeat + 1):
            for setup in setups:
                rows.append({**await drain_setup(urls, setup, n=n, handler=handler),
                             "run": run})
                bar.update()
    return rows


async def latency_comparison(urls: Mapping[str, str], setups: Sequence[Mapping[str, Any]], *,
                             rates: Sequence[float], seconds: float, repeat: int
                             ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Open-loop runs of every setup at every rate (jobqueue and the Python
    peers): summaries, and every job's latencies (ms)."""
    setups = _runnable(setups)
    summaries, samples = [], []
    with scenarios.progress(len(setups) * len(rates) * repeat, "latency") as bar:
        for run in range(1, repeat + 1):
            for rate in rates:
                for setup in setups:
                    system = setup["system"]
                    if system == "jobqueue":
                        result = await scenarios.open_loop(
                            urls[system], rate=rate, seconds=seconds,
                            flags=jobqueue_flags(setup))
                        argv = shlex.split(result["summary"]["argv"])
                        result["summary"] = {"system": system,
                                             "settings": scenarios.worker_label(argv),
                                             **result["summary"]}
                    else:
                        result = await open_loop(
                            system, urls[system], rate=rate, seconds=seconds,
                            batch_size=int(setup.get("batch_size", 10)),
                            concurrency=int(setup.get("concurrency", 1)))
                    summary = result["summary"]
                    summaries.append({**summary, "run": run})
                    samples += [{"system": system, "settings": summary["settings"],
                                 "rate": rate, "run": run, "to_start_ms": s * 1000,
                                 "to_complete_ms": c * 1000}
                                for s, c in zip(result["to_start"], result["to_complete"],
                                                strict=True)]
                    bar.update()
    return summaries, samples


async def memory_comparison(urls: Mapping[str, str], setups: Sequence[Mapping[str, Any]]
                            ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One long drain per setup (each with its own `n`), RSS sampled: the
    summaries, and the timelines. jobqueue runs as `cli_drain` runs it."""
    setups = _runnable(setups)
    summaries, timelines = [], []
    with scenarios.progress(len(setups), "memory") as bar:
        for setup in setups:
            system, n = setup["system"], int(setup["n"])
            if system == "jobqueue":
                result = await scenarios.memory_timeline(urls[system], n=n,
                                                         flags=jobqueue_flags(setup))
                label = {"system": system, "settings": result["summary"]["settings"]}
            else:
                result = await memory_timeline(
                    system, urls[system], n=n, batch_size=int(setup.get("batch_size", 10)),
                    concurrency=int(setup.get("concurrency", 1)))
                label = {"system": system, "settings": settings(setup)}
            summaries.append({**result["summary"], **label})
            timelines += [{**label, "n": n, **point} for point in result["timeline"]]
            bar.update()
    return summaries, timelines
