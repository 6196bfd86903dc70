"""jobqueue beside its peers: PgQueuer, Procrastinate, oban-py (`obanpy`,
in a Python 3.12+ virtualenv of its own), graphile-worker (`graphile`, a
Node.js package) and the course's design, measured the same way on the same
server, one after another in one run.

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
| oban-py | `oban_jobs.inserted_at` | `attempted_at` | `completed_at` |

PgQueuer deletes a finished job from its queue table, so its log is the only
record; Procrastinate keeps its jobs (its default `delete_jobs="never"`) and
writes an event row per transition from triggers. Every one of these is the
time of the statement that makes the change; its commit follows within about
a millisecond.

Three measurements, each returning plain rows like `scenarios.drain`'s
plus `system`, `argv` and `settings` columns:

- `drain`: N jobs already queued, W worker processes; throughput from the
  first claim to the last recorded completion, every job checked done, each
  process's resident memory sampled (`rss`). The jobs are no-ops, or do real
  work: `write_row` (one INSERT) or `process_payment` (the seed's UPDATE of a
  balance and INSERT of a payment, in one transaction), each peer's task
  writing the way its docs show (`peer_worker`); every job's rows are checked
  (`scenarios.check_writes`).
- `open_loop`: jobs enqueued one by one, each in its own transaction, at
  scheduled times, over one asyncpg pool for every system: jobqueue's plain
  INSERT, PgQueuer's own `Queries.enqueue`, Procrastinate's own defer
  statement (the SQL function `Task.defer_async` calls); one idle worker.
  Latency from enqueue to start and to completion recorded, the first
  `WARMUP` s of arrivals left out, a percentile given only where the sample
  carries it (`carried`), and flags for a rate not met or a backlog.
- `memory_timeline`: one worker draining a big table, its RSS over time.

`drain_comparison`, `latency_comparison` and `memory_comparison` run a list of
setups (dicts: `{"system": "pgqueuer", "batch_size": 1000, "workers": 2}`;
`comparison_setups` builds the notebook's: every queue with the same numbers
of processes, each configured as its docs advise for throughput,
`RECOMMENDED`), jobqueue and the course's design included. A jobqueue setup
is the worker's command line: `{"system": "jobqueue", "flags": [], "workers":
1}` is `jobqueue worker --import MODULE` exactly as the README starts it
(`scenarios.cli_drain`). Every run records the arguments its processes got
(`argv`: jobqueue's command line, `peer_worker.py`'s, graphile-worker's
config knobs), and its label is read back from them alone (`label`, with
each worker's own parser), so a label cannot name a knob the run did not
use. A setup may carry its own `n` (Procrastinate's few hundred jobs/s want a
smaller drain than the others); every row says which n it drained.
"""

from __future__ import annotations

import asyncio
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
from jobqueue.benchmarks import graphile, obanpy, rss, scenarios
from jobqueue.benchmarks.peer_worker import (
    HANDLERS,
    NOOP,
    PEER_BENCH_TABLE,
    PROCESS_PAYMENT,
    build_parser,
)
from jobqueue.benchmarks.quick import check_bench_name, quantile
from jobqueue.testing import WorkerProcess, wait_for

logger = logging.getLogger(__name__)

PEER_WORKER = Path(__file__).with_name("peer_worker.py")
GRAPHILE = graphile.SYSTEM
OBAN = obanpy.SYSTEM
SYSTEMS = ("jobqueue", "pgqueuer", "procrastinate", OBAN, GRAPHILE, "course design")
PEERS = ("pgqueuer", "procrastinate", OBAN, GRAPHILE)
FILL_CHUNK = 10_000
#: What each system's own documentation advises for throughput, in this
#: lab's words (read 2026-12-01), and the pages that say it. The notebook and
#: BENCHMARKS.md print it beside every table, under the setups that ran.
RECOMMENDED: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {
    "jobqueue": (
        "The README starts it as `jobqueue worker --import MODULE` with the CLI's defaults "
        "(2 lanes, batches of up to 1,000, quick batches); `--shared` lets several processes "
        "work at once instead of one active and the others standing by.",
        ()),
    "pgqueuer": (
        "Its performance guide: raise `batch_size` (default 10) when jobs are short-lived "
        "(under a second), without giving a number; `max_concurrent_tasks` unset (no cap; "
        "if set, at least twice the batch); the `durable` default; `pgq autovac` after "
        "installing; a "
        "dedicated asyncpg connection for the worker. Its deployment guide: one worker "
        "process per CPU core for CPU-bound work. Its benchmark tool runs 5 queue managers "
        "of batch 10 in one process.",
        (("performance tuning", "https://janbjorge.github.io/pgqueuer/guides/performance-tuning/"),
         ("deployment", "https://janbjorge.github.io/pgqueuer/guides/deployment/"),
         ("benchmarks", "https://janbjorge.github.io/pgqueuer/comparisons/benchmarks/"))),
    "procrastinate": (
        "Its docs: a worker runs one job at a time by default; for throughput, launch several "
        "workers, each in its own process, and give async tasks `concurrency` (their example: "
        "30); with short jobs the pool should hold as many connections as the concurrency, "
        "plus one.",
        (("concurrency",
          "https://procrastinate.readthedocs.io/en/stable/howto/production/concurrency.html"),
         ("pool size", "https://procrastinate.readthedocs.io/en/stable/discussions.html"
                       "#mind-the-size-of-your-postgresql-pool"))),
    OBAN: (
        "Its production guide recommends its CLI, `oban start` (a JSON log line per job at "
        "INFO, pruning and orphan rescue on), with queues given as `name:limit`: its docs' "
        "examples use `default = 10`, with the connection pool at its defaults (1 to 10). "
        "It says nothing about throughput; the tasks write through a psycopg pool of their own, "
        "as large as the limit.",
        (("production", "https://github.com/oban-bg/oban-py/blob/main/docs/production.md"),
         ("defining queues",
          "https://github.com/oban-bg/oban-py/blob/main/docs/defining_queues.md"))),
    GRAPHILE: (
        "Its performance page: batching (a local queue, completions batched) for any "
        "high-throughput queue, and perfTest, its own benchmark: 4 processes of 24 concurrent "
        "jobs each, a pool of 25, a local queue of 500, `completeJobBatchDelay` and "
        "`failJobBatchDelay` 0, tuned for an i9-14900K.",
        (("performance", "https://worker.graphile.org/docs/performance"),
         ("config", "https://worker.graphile.org/docs/config"))),
    "course design": (
        "The course's own runner (`jobqueue/benchmarks/course.py`): a transaction and ORM "
        "round trips per job, in the benchmark's process.",
        ()),
}
#: What each Python peer package is called, for its version in the results.
PACKAGES = {"pgqueuer": "pgqueuer", "procrastinate": "procrastinate"}


def available(system: str) -> bool:
    """Whether a peer can run here: a Python peer installed (`make setup`
    installs the `peers` extra), graphile-worker with node and npm on PATH
    (`graphile.available`, one warning line otherwise); jobqueue and the
    course's design always."""
    if system == GRAPHILE:
        return graphile.available()
    if system == OBAN:
        return obanpy.available()
    package = PACKAGES.get(system)
    return package is None or importlib.util.find_spec(package) is not None


def versions() -> dict[str, str]:
    """The installed peers' versions, for the results files' header."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for system, package in PACKAGES.items():
        with contextlib.suppress(PackageNotFoundError):
            found[f"{system}_version"] = version(package)
    if obanpy.available():
        found[f"{OBAN}_version"] = obanpy.VERSION
        found[f"{OBAN}_python"] = obanpy.python_version()
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
    #: The system's own tables that a job's life writes to: what the pressure
    #: benchmark measures (dead tuples, sizes) and its readers scan.
    tables: tuple[str, ...]
    #: The table of per-job events: (table, time column, kind column), and the
    #: kinds that mean enqueued, started (claimed) and completed.
    events: tuple[str, str, str]
    kinds: tuple[str, str, str]
    drain_sql: str
    #: Whether its worker has a mode that exits once the queue is empty; a
    #: worker without one is stopped once `done_sql` finds nothing left to run.
    drains_itself = True
    done_sql = ""
    #: Completed jobs other than the warm-up job $1, and that job alone.
    completed_sql: str
    warm_sql: str

    @property
    def latency_sql(self) -> str:
        """Each job's three times (epoch seconds), for every job but $1."""
        table, at, kind = self.events
        times = ", ".join(
            f"extract(epoch FROM min({at}) FILTER (WHERE {kind} = '{k}')) AS {name}"
            for name, k in zip(("enqueued", "started", "completed"), self.kinds, strict=True))
        return f"SELECT job_id AS id, {times} FROM {table} WHERE job_id <> $1 GROUP BY job_id"

    async def install(self, url: str) -> None:
        raise NotImplementedError

    def process(self, url: str, log: Path, args: Sequence[str]) -> WorkerProcess:
        """One worker process with the run's arguments (`argv`): `peer_worker.py`."""
        return WorkerProcess(url, log, *args, command=("-P", str(PEER_WORKER), self.system),
                             env=libpq_env(url))

    async def enqueue_many(self, url: str, n: int, handler: str) -> None:
        """n jobs of type `handler` through the peer's own batch API, chunk by chunk."""
        raise NotImplementedError

    def enqueue_one(self, pool: asyncpg.Pool) -> Callable[[], Awaitable[Any]]:
        """One job in its own transaction on `pool`; returns its id."""
        raise NotImplementedError

    async def fill(self, url: str, n: int, handler: str) -> None:
        """`enqueue_many`, then VACUUM ANALYZE so every run starts alike."""
        await self.enqueue_many(url, n, handler)
        await self.vacuum_analyze(url)

    async def vacuum_analyze(self, url: str) -> None:
        conn = await db.connect(url, application_name="jobqueue bench")
        try:
            for table in self.vacuum:
                await conn.execute(f"VACUUM ANALYZE {table}")
        finally:
            await conn.close()

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
    tables = vacuum
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
    completed_sql = "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful' AND job_id <> $1"
    warm_sql = "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful' AND job_id = $1"

    async def install(self, url: str) -> None:
        from pgqueuer import Queries

        conn = await db.connect(url, application_name="jobqueue bench")
        try:
            queries = Queries.from_asyncpg_connection(conn)
            await queries.install()
            await queries.optimize_autovacuum()
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



class _Procrastinate(_Peer):
    """Procrastinate: installed with `SchemaManager.apply_schema_async()` (what
    `procrastinate schema --apply` runs); the psycopg connector, which its
    docs use throughout; an async no-op task."""

    system = "procrastinate"
    truncate = ("TRUNCATE procrastinate_jobs, procrastinate_events, "
                "procrastinate_periodic_defers, procrastinate_workers")
    vacuum = ("procrastinate_jobs", "procrastinate_events")
    tables = vacuum
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
                     " WHERE status = 'succeeded' AND id <> $1")
    warm_sql = "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded' AND id = $1"
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


class _Oban(_Peer):
    """oban-py (`obanpy`): installed by its own `oban install`, run by its
    own `oban start`, jobs written with the statement its `enqueue` sends."""

    system = OBAN
    truncate = "TRUNCATE oban_jobs, oban_producers, oban_leaders"
    vacuum = ("oban_jobs",)
    tables = vacuum
    #: A job run twice would have a second attempt: counted apart.
    drain_sql = """
        SELECT count(*) FILTER (WHERE state = 'completed') AS completed,
               count(*) FILTER (WHERE state = 'completed' AND attempt = 1) AS distinct_completed,
               count(*) AS total,
               count(*) FILTER (WHERE state <> 'completed') AS left_in_queue,
               extract(epoch FROM min(attempted_at)) AS first,
               extract(epoch FROM max(completed_at)) AS last
        FROM oban_jobs"""
    drains_itself = False
    #: Two probes of its (state, queue, …) index.
    done_sql = ("SELECT NOT EXISTS (SELECT FROM oban_jobs WHERE state = 'available')"
                " AND NOT EXISTS (SELECT FROM oban_jobs WHERE state = 'executing')")
    completed_sql = "SELECT count(*) FROM oban_jobs WHERE state = 'completed' AND id <> $1"
    warm_sql = "SELECT count(*) FROM oban_jobs WHERE state = 'completed' AND id = $1"
    #: What `Oban.enqueue` sends (`queries/insert_job.sql` of 0.7.0), with its
    #: defaults for what the lab's jobs leave unset: one row, and a NOTIFY that
    #: wakes the producers of its queue.
    insert_sql = """
        WITH inserted AS (
            INSERT INTO oban_jobs (args, inserted_at, max_attempts, meta, priority, queue,
                                   scheduled_at, state, tags, worker)
            VALUES ($1::jsonb, timezone('UTC', now()), 20, '{}', 0, 'default',
                    timezone('UTC', now()), 'available', '{}', $2)
            RETURNING id, queue)
        SELECT id, pg_notify('public.oban_insert', '{"queue":"' || queue || '"}')
        FROM inserted"""

    @property
    def latency_sql(self) -> str:
        return ("SELECT id, extract(epoch FROM inserted_at) AS enqueued,"
                " extract(epoch FROM attempted_at) AS started,"
                " extract(epoch FROM completed_at) AS completed FROM oban_jobs WHERE id <> $1")

    def process(self, url: str, log: Path, args: Sequence[str]) -> WorkerProcess:
        return obanpy.process(conninfo(url), libpq_env(url), log, list(args))

    async def install(self, url: str) -> None:
        await asyncio.to_thread(obanpy.install_schema, conninfo(url))

    async def enqueue_many(self, url: str, n: int, handler: str) -> None:
        """The rows `Oban.enqueue_many` writes, one statement per chunk (it
        sends its insert once per job); no NOTIFY, as nothing listens yet."""
        arguments = ([json.dumps(p) for p in scenarios.payments(n)]
                     if handler == PROCESS_PAYMENT else ["{}"] * n)
        conn = await db.connect(url, application_name="jobqueue bench")
        try:
            for start in range(0, n, FILL_CHUNK):
                await conn.execute(
                    "INSERT INTO oban_jobs (args, worker, queue, state)"
                    " SELECT a, $2, 'default', 'available'"
                    " FROM unnest($1::jsonb[]) WITH ORDINALITY AS u (a, i) ORDER BY i",
                    arguments[start:start + FILL_CHUNK], obanpy.WORKER_NAMES[handler])
        finally:
            await conn.close()

    def enqueue_one(self, pool: asyncpg.Pool) -> Callable[[], Awaitable[Any]]:
        """`insert_sql` (what `Oban.enqueue` sends) on the shared asyncpg pool."""
        return lambda: pool.fetchval(self.insert_sql, "{}", obanpy.WORKER_NAMES[NOOP])


_PEERS: dict[str, _Peer] = {"pgqueuer": _PgQueuer(), "procrastinate": _Procrastinate(),
                            OBAN: _Oban()}


def _peer(system: str) -> _Peer:
    if system not in _PEERS:
        raise ValueError(f"unknown Python peer {system!r}; one of {sorted(_PEERS)}")
    if not available(system):
        raise ModuleNotFoundError(
            f"{system} cannot run here (see the warning above)" if system == OBAN else
            f"{system} is not installed: `make setup` installs the `peers` extra "
            "(pip install -e '.[peers]')")
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
    conn = await db.connect(url, application_name="jobqueue bench")
    try:  # the tables the tasks write, beside the peer's own schema
        await conn.execute(PEER_BENCH_TABLE)
        await scenarios.create_demo_tables(conn)
    finally:
        await conn.close()
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


def argv(setup: Mapping[str, Any], handler: str = NOOP) -> list[str]:
    """The arguments a setup's worker processes get: jobqueue's command line
    (`scenarios.worker_argv`), `peer_worker.py`'s (after the system's name,
    without `--drain`), graphile-worker's knobs as `name=value` words (they go
    into the config file `graphile.write_config` writes); the course design
    has none. Runs record these (`argv` column) and `label` reads them back."""
    system = setup["system"]
    if system == "jobqueue":
        return scenarios.worker_argv(handler, *jobqueue_flags(setup))
    if system == "pgqueuer":
        return ["--batch-size", str(setup.get("batch_size", 10))]
    if system == "procrastinate":
        return ["--concurrency", str(setup.get("concurrency", 1))]
    if system == OBAN:
        return obanpy.worker_argv(int(setup.get("limit", obanpy.DOCS_LIMIT)))
    if system == GRAPHILE:
        return graphile.knobs(graphile.preset_options(_graphile_concurrency(setup)))
    if system == "course design":
        return []
    raise ValueError(f"unknown system {system!r}; one of {SYSTEMS}")


def _words(args: str | Sequence[str]) -> list[str]:
    return shlex.split(args) if isinstance(args, str) else [str(a) for a in args]


def label(system: str, args: str | Sequence[str], workers: int = 1) -> str:
    """A setup as the tables show it, read back from the arguments its
    processes got (`argv`, as recorded): jobqueue's by its own CLI parser
    (`scenarios.worker_label`), the Python peers' by `peer_worker`'s parser,
    graphile-worker's from the config knobs. Nothing else feeds a label, so it
    cannot name a knob the run did not use."""
    words = _words(args)
    procs = f"{workers} process{'es' if workers > 1 else ''}"
    if system == "jobqueue":
        return scenarios.worker_label(words, workers)
    if system == OBAN:
        return obanpy.settings(words, workers)
    if system in _PEERS:
        opts = build_parser().parse_args([system, *words])
        if system == "pgqueuer":
            return f"batch {opts.batch_size}, {procs}"
        return f"concurrency {opts.concurrency}, {procs}"
    if system == GRAPHILE:
        knobs = dict(w.split("=", 1) for w in words)
        return graphile.settings(workers, int(knobs["concurrentJobs"]))
    if system == "course design":
        return "a transaction per job, ORM, in-process"
    raise ValueError(f"unknown system {system!r}; one of {SYSTEMS}")


def settings(setup: Mapping[str, Any], handler: str = NOOP) -> str:
    """The label a setup will get (`label` of its `argv`), before it runs."""
    return label(setup["system"], argv(setup, handler), int(setup.get("workers", 1)))


#: The `preset` column's names for the two setups the findings single out.
CLI_DEFAULTS = "CLI defaults"
PERFTEST = "perfTest"


def preset_of(system: str, args: str | Sequence[str], workers: int = 1) -> str:
    """`CLI_DEFAULTS` for one jobqueue process given no flag but `--import`,
    `PERFTEST` for graphile-worker in its perfTest configuration (processes
    and concurrency both perfTest's), else empty; read from the recorded
    arguments, like `label`."""
    words = _words(args)
    if system == "jobqueue" and workers == 1 and len(words) == 2 and words[0] == "--import":
        return CLI_DEFAULTS
    if system == GRAPHILE and workers == graphile.PERFTEST_PROCESSES and (
            words == argv({"system": GRAPHILE})):
        return PERFTEST
    return ""


def preset(setup: Mapping[str, Any]) -> str:
    """`preset_of` a setup, before it runs."""
    return preset_of(setup["system"], argv(setup), int(setup.get("workers", 1)))


def comparison_setups(handler: str, *, processes: Sequence[int], pgqueuer_batch: int,
                      procrastinate_concurrency: int, procrastinate_n: int, course_n: int,
                      graphile_worker: bool = True, perftest: bool = False,
                      oban_limit: int | None = obanpy.DOCS_LIMIT) -> list[dict[str, Any]]:
    """The comparison's setups for one workload, system by system: every
    queue with each of `processes` worker processes, as its docs advise for
    throughput (`RECOMMENDED`): jobqueue at the CLI's defaults (`--shared`
    for more than one process, so that all of them work), PgQueuer at
    `pgqueuer_batch`, graphile-worker with perfTest's options, Procrastinate at
    `procrastinate_concurrency` (and its smaller `procrastinate_n`), oban-py
    by `oban start` with a queue of `oban_limit` (None: left out); plus
    graphile-worker's whole perfTest configuration (`perftest`) and the
    course's design (no-op jobs only)."""
    def each(setup: dict[str, Any]) -> list[dict[str, Any]]:
        return [{**setup, "workers": k} for k in processes]

    setups = [*[{"system": "jobqueue", "flags": [] if k == 1 else ["--shared"], "workers": k}
                for k in processes],
              *each({"system": "pgqueuer", "batch_size": pgqueuer_batch})]
    if graphile_worker:
        setups += each({"system": GRAPHILE})
        if perftest:
            setups.append({"system": GRAPHILE, "workers": graphile.PERFTEST_PROCESSES})
    setups += each({"system": "procrastinate", "concurrency": procrastinate_concurrency,
                    "n": procrastinate_n})
    if oban_limit is not None:
        setups += each({"system": OBAN, "limit": oban_limit})
    if handler == NOOP:
        setups.append({"system": "course design", "n": course_n})
    return setups


# -- drain -------------------------------------------------------------------------


async def drain(system: str, url: str, *, n: int, workers: int = 1, batch_size: int = 10,
                concurrency: int = 1, limit: int = obanpy.DOCS_LIMIT, handler: str = NOOP,
                timeout: float = 900.0, log_dir: Path | None = None) -> dict[str, Any]:
    """One drain of a Python peer: fill n jobs of type `handler`, start
    `workers` worker processes (PgQueuer's `batch_size`, Procrastinate's
    `concurrency`, oban-py's queue `limit`) in the peer's drain mode and wait
    for them to exit, or, for a peer without one, stop them (SIGTERM) once no
    job is left to run; throughput from the first claim to the last
    completion the peer recorded, and each process's RSS. Raises RuntimeError
    unless every job completed exactly once and wrote exactly its rows
    (`scenarios.check_writes`)."""
    setup = {"system": system, "workers": workers, "batch_size": batch_size,
             "concurrency": concurrency, "limit": limit}
    row, _ = await _drain(system, url, n=n, setup=setup, handler=handler, timeout=timeout,
                          log_dir=log_dir)
    return row


async def _drain(system: str, url: str, *, n: int, setup: Mapping[str, Any], handler: str,
                 timeout: float, log_dir: Path | None
                 ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    peer = _peer(system)
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix=f"{system}-drain-"))
    workers = int(setup.get("workers", 1))
    await fill(system, url, n, handler)
    args = argv(setup)
    drain_mode = ["--drain"] if peer.drains_itself else []
    procs = [peer.process(url, log_dir / f"drain-{i}.log", [*args, *drain_mode])
             for i in range(workers)]
    try:
        async with rss.RssSampler(p.pid for p in procs) as sampler:
            if peer.drains_itself:
                for p in procs:
                    await p.finish(timeout)
            else:  # stopped as jobqueue's workers are, once nothing is left to run
                conn = await db.connect(url, application_name="jobqueue bench")
                try:
                    await scenarios.until_done(conn, procs, timeout, done_sql=peer.done_sql,
                                               registered=False)
                finally:
                    await conn.close()
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
    batch: int | None
    concurrency: int | None
    if system == OBAN:
        batch, concurrency = None, obanpy.limit_of(args)
    else:
        opts = build_parser().parse_args([system, *args])
        batch = opts.batch_size if system == "pgqueuer" else None
        concurrency = opts.concurrency if system == "procrastinate" else None
    result = {"system": system, "argv": shlex.join(args), "settings": label(system, args, workers),
              "n": n, "workers": workers, "batch_size": batch, "concurrency": concurrency,
              "handler": handler, "seconds": seconds, "jobs_per_sec": n / seconds,
              **rss.summary(sampler.samples, first, last)}
    return result, rss.timeline(sampler.samples, first)


async def memory_timeline(system: str, url: str, *, n: int,
                          setup: Mapping[str, Any] | None = None, timeout: float = 3600.0
                          ) -> dict[str, Any]:
    """One worker of a peer draining n jobs, its RSS sampled over time (as
    `scenarios.memory_timeline`), configured by `setup` (as `argv` reads it)."""
    row, timeline = await _drain(system, url, n=n,
                                 setup={**(setup or {}), "system": system, "workers": 1},
                                 handler=NOOP, timeout=timeout, log_dir=None)
    return {"summary": row, "timeline": timeline}


# -- latency -----------------------------------------------------------------------

#: Seconds of arrivals at the start of each open-loop run left out of its
#: figures (the worker's first batches, caches and plans still warming up).
WARMUP = 1.0


def carried(q: float, samples: int) -> bool:
    """Whether `samples` values carry the q-quantile: at least one value lies
    beyond it (p99 needs 100, p99.9 needs 1,000)."""
    return samples * (1 - q) >= 1 - 1e-9


class _JobQueue(_Peer):
    """jobqueue in the same open-loop run as the peers: a plain INSERT per
    job on the same asyncpg pool, the worker started with the setup's command
    line (`argv`), the times from its jobs table."""

    system = "jobqueue"
    truncate = "TRUNCATE jobs, jobqueue_workers"
    vacuum = ("jobs",)
    #: The batch ledger too: every quick batch overwrites its lane's row.
    tables = ("jobs", "jobqueue_batches")
    completed_sql = "SELECT count(*) FROM jobs WHERE status = 'completed' AND id <> $1"
    warm_sql = "SELECT count(*) FROM jobs WHERE status = 'completed' AND id = $1"

    @property
    def latency_sql(self) -> str:
        return ("SELECT id, extract(epoch FROM created_at) AS enqueued,"
                " extract(epoch FROM started_at) AS started,"
                " extract(epoch FROM completed_at) AS completed FROM jobs WHERE id <> $1")

    def enqueue_one(self, pool: asyncpg.Pool) -> Callable[[], Awaitable[Any]]:
        return lambda: pool.fetchval("INSERT INTO jobs (job_type) VALUES ('noop') RETURNING id")


def _latency_peer(system: str) -> _Peer:
    return _JobQueue() if system == "jobqueue" else _peer(system)


def latency_summary(rate: float, seconds: float, lateness: Sequence[float],
                    times: Sequence[tuple[float, float, float]], warmup: float = WARMUP
                    ) -> dict[str, Any]:
    """An open-loop run's figures from each job's (enqueued, started,
    completed) epoch seconds: the rate the producer achieved (over every
    arrival), then the jobs enqueued `warmup` s or more after the first, and
    their quantiles in ms where they carry them (`carried`; NaN otherwise);
    `completed_rate` (their completions per second, first to last) says
    whether the system kept up with the arrivals (`kept_up`) or worked off a
    growing backlog at its own pace."""
    times = sorted(times)
    first = times[0][0]
    span = times[-1][0] - first
    counted = [t for t in times if t[0] - first >= warmup]
    achieved = (len(times) - 1) / span if span > 0 else float(len(times))
    summary: dict[str, Any] = {
        "rate": rate, "seconds": seconds, "warmup_s": warmup, "arrivals": len(times),
        "jobs": len(counted), "achieved_rate": achieved,
        "rate_met": achieved >= 0.95 * rate,
        "producer_late_p99_ms": quantile(lateness, 0.99) * 1000}
    done = sorted(t[2] for t in counted)
    busy = done[-1] - done[0] if len(done) > 1 else 0.0
    summary["completed_rate"] = (len(done) - 1) / busy if busy > 0 else float("nan")
    summary["kept_up"] = not summary["completed_rate"] < 0.95 * achieved
    for name, i in (("start", 1), ("complete", 2)):
        values = [t[i] - t[0] for t in counted]
        for q in scenarios.QUANTILES:
            summary[f"{name}_p{_qname(q)}_ms"] = (
                quantile(values, q) * 1000 if carried(q, len(values)) else float("nan"))
    return summary


def _qname(q: float) -> str:
    return f"{q * 100:g}".replace(".", "_")


class IdleWorker:
    """One system's worker process, up and idle (`idle_worker`), with the
    producer that enqueues its jobs and a connection for the measurements."""

    def __init__(self, system: str, args: list[str], worker: WorkerProcess,
                 conn: asyncpg.Connection, enqueue_one: Callable[[], Awaitable[Any]],
                 warm_id: Any) -> None:
        self.system, self.args, self.worker, self.conn = system, args, worker, conn
        self.enqueue_one, self.warm_id = enqueue_one, warm_id
        self.peer = _latency_peer(system)

    async def completed(self, count: int) -> bool:
        """Whether `count` jobs besides the first one are done (RuntimeError
        if the worker has exited)."""
        return await _completed(self.conn, self.peer, self.peer.completed_sql, self.warm_id,
                                count, self.worker)

    async def wait_completed(self, count: int, timeout: float) -> None:
        await wait_for(lambda: self.completed(count), timeout=timeout, interval=0.05,
                       message=f"every {self.system} job completed")

    async def times(self) -> list[tuple[float, float, float]]:
        """Each completed job's (enqueued, started, completed) epoch seconds,
        from the system's own timestamps, the first job left out (a system's
        query may give its unfinished jobs too, without a completion time)."""
        rows = await self.conn.fetch(self.peer.latency_sql, self.warm_id)
        return [(float(r["enqueued"]), float(r["started"]), float(r["completed"]))
                for r in rows if r["completed"] is not None and r["started"] is not None]


@contextlib.asynccontextmanager
async def idle_worker(system: str, url: str, setup: Mapping[str, Any] | None = None, *,
                      connections: int = 8, log_dir: Path | None = None
                      ) -> AsyncIterator[IdleWorker]:
    """The system's tables emptied and vacuumed, one worker process
    (continuous mode, woken by its LISTEN/NOTIFY) started with the setup's
    `argv`, and a producer: each system's `enqueue_one` over the same asyncpg
    pool. A first job, sent and completed before this yields, proves the
    worker is up; `IdleWorker` leaves it out of everything it counts."""
    setup = {"system": system, **(setup or {})}
    peer = _latency_peer(system)
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix=f"{system}-latency-"))
    args = argv(setup)
    await _reset(url, peer, NOOP)
    await peer.vacuum_analyze(url)
    conn = await db.connect(url, application_name="jobqueue bench")
    if system == "jobqueue":
        worker = WorkerProcess(url, log_dir / "worker.log", *args)
    else:
        worker = peer.process(url, log_dir / "worker.log", args)
    try:
        async with peer.producer(url, connections) as enqueue_one:
            warm = await enqueue_one()
            warm_id = warm[0] if isinstance(warm, list) else warm
            await wait_for(lambda: _completed(conn, peer, peer.warm_sql, warm_id, 1, worker),
                           timeout=60, message=f"{system}'s worker to finish a first job")
            yield IdleWorker(system, args, worker, conn, enqueue_one, warm_id)
    finally:
        await worker.stop()
        await conn.close()


async def open_loop(system: str, url: str, *, rate: float, seconds: float,
                    setup: Mapping[str, Any] | None = None, connections: int = 8,
                    warmup: float = WARMUP, log_dir: Path | None = None) -> dict[str, Any]:
    """Arrivals at `rate` jobs/s for `warmup` + `seconds`, each enqueued in
    its own transaction at its scheduled time, to one idle worker
    (`idle_worker`); the first `warmup` s of arrivals are left out of the
    figures (`latency_summary`). Returns the summary (with `system`, `argv`,
    `settings`) and the counted jobs' latencies (s)."""
    total = max(1, round(rate * (seconds + warmup)))
    async with idle_worker(system, url, setup, connections=connections,
                           log_dir=log_dir) as running:
        lateness = await scenarios.arrivals(running.enqueue_one, rate, total)
        await running.wait_completed(total, timeout=seconds + warmup + 120)
        times = await running.times()
        args = running.args
    summary = latency_summary(rate, seconds, lateness, times, warmup)
    first = min(t[0] for t in times)
    counted = [t for t in sorted(times) if t[0] - first >= warmup]
    return {"summary": {"system": system, "argv": shlex.join(args),
                        "settings": label(system, args), **summary},
            "to_start": [t[1] - t[0] for t in counted],
            "to_complete": [t[2] - t[0] for t in counted]}


async def _completed(conn: asyncpg.Connection, peer: _Peer, sql: str, marker: Any, count: int,
                     worker: WorkerProcess) -> bool:
    if worker.proc.poll() is not None:
        raise RuntimeError(f"{peer.system} worker exited: {worker.log()[-2000:]}")
    return bool(await conn.fetchval(sql, marker) >= count)


# -- the comparison: setups run one after another, repeated --------------------------


def runnable(setups: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
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
    client clock: it has no worker process of its own). The row's `settings`
    and `preset` are read back from the `argv` the run recorded."""
    system = setup["system"]
    n = int(setup.get("n", n))
    workers = int(setup.get("workers", 1))
    if system == "jobqueue":
        row = await scenarios.cli_drain(urls["jobqueue"], n=n, handler=handler,
                                        flags=jobqueue_flags(setup), workers=workers)
    elif system == "course design":
        if handler != NOOP:
            raise ValueError("the course design runs no-op jobs only")
        (row,) = await scenarios.course_drains(urls["jobqueue"], n=n, repeat=1)
        row.pop("run", None)
        row.update(workers=1, argv="")
    elif system == GRAPHILE:
        row = await graphile.drain(urls[GRAPHILE], n=n, workers=workers, handler=handler,
                                   concurrency=_graphile_concurrency(setup))
    else:
        row, _ = await _drain(system, urls[system], n=n, setup=setup, handler=handler,
                              timeout=900.0, log_dir=None)
    return {**row, "system": system, "settings": label(system, row["argv"], workers),
            "preset": preset_of(system, row["argv"], workers)}


async def drain_comparison(urls: Mapping[str, str], setups: Sequence[Mapping[str, Any]], *,
                           n: int, repeat: int, handler: str = NOOP) -> list[dict[str, Any]]:
    """Every setup drains n jobs of type `handler` (or the setup's own `n`),
    `repeat` rounds; within a round the setups run one after another, so a
    slow spell of the machine hits them all rather than one system's runs."""
    setups = runnable(setups)
    rows = []
    with scenarios.progress(len(setups) * repeat, f"drain ({handler})") as bar:
        for run in range(1, repeat + 1):
            for setup in setups:
                rows.append({**await drain_setup(urls, setup, n=n, handler=handler),
                             "run": run})
                bar.update()
    return rows


async def latency_comparison(urls: Mapping[str, str], setups: Sequence[Mapping[str, Any]], *,
                             rates: Sequence[float], seconds: float, repeat: int,
                             warmup: float = WARMUP
                             ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Open-loop runs (`open_loop`) of every setup at every rate (jobqueue
    and the Python peers, through the same producer), `repeat` rounds: the
    summaries, and every counted job's latencies (ms)."""
    setups = runnable(setups)
    summaries, samples = [], []
    with scenarios.progress(len(setups) * len(rates) * repeat, "latency") as bar:
        for run in range(1, repeat + 1):
            for rate in rates:
                for setup in setups:
                    system = setup["system"]
                    result = await open_loop(system, urls[system], rate=rate, seconds=seconds,
                                             setup=setup, warmup=warmup)
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
    """One long drain per setup (each with its own `n`), one worker, RSS
    sampled: the summaries (with the change per 10,000 jobs, comparable
    where the n differ), and the timelines. jobqueue runs as `cli_drain` runs
    it; every label is read back from the recorded `argv`."""
    setups = runnable(setups)
    summaries, timelines = [], []
    with scenarios.progress(len(setups), "memory") as bar:
        for setup in setups:
            system, n = setup["system"], int(setup["n"])
            if system == "jobqueue":
                result = await scenarios.memory_timeline(urls[system], n=n,
                                                         flags=jobqueue_flags(setup))
            else:
                result = await memory_timeline(system, urls[system], n=n, setup=setup)
            row = result["summary"]
            tags = {"system": system, "settings": label(system, row["argv"])}
            growth = row["rss_end_mib"] - row["rss_start_mib"]
            summaries.append({**row, **tags, "rss_per_10k_jobs_mib": growth / n * 10_000})
            timelines += [{**tags, "n": n, "drain_seconds": row["seconds"], **point}
                          for point in result["timeline"]]
            bar.update()
    return summaries, timelines
