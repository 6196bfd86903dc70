"""jobqueue beside its peers (PgQueuer, Procrastinate, oban-py,
graphile-worker, the course's design), measured alike on the same server,
one after another, each behind `adapter.Peer` in a database of its own.

A drain: N jobs queued, W worker processes, from the first claim to the
last recorded completion, every job checked done once and its writes
checked, RSS sampled. `open_loop`: jobs enqueued one by one at scheduled
times over one asyncpg pool (each system's own enqueue statement) to one
idle worker, the first `WARMUP` s left out, a percentile only where the
sample carries it. Memory: one worker draining a big table. The figures
are each system's own timestamps, on the database's clock (each its
statement's time; the commit follows within about a millisecond):

| system | enqueued | started (claimed) | completion recorded |
|---|---|---|---|
| jobqueue | `jobs.created_at` | `jobs.started_at` | `jobs.completed_at` |
| PgQueuer | `pgqueuer_log` row `queued` | row `picked` | row `successful` |
| Procrastinate | `procrastinate_events` `deferred` | `started` | `succeeded` |
| oban-py | `oban_jobs.inserted_at` | `attempted_at` | `completed_at` |

(graphile-worker records no completion: `graphile` says how it is timed.)
A setup is a dict (`{"system": "pgqueuer", "batch_size": 1000, "workers":
2}`; jobqueue's `{"flags": []}` is `jobqueue worker --import MODULE`), maybe
with its own `n`; its label is read back from the arguments its processes
got (`argv`), so it cannot name a knob the run did not use.
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import asyncpg

from jobqueue import db, embedded
from jobqueue.benchmarks import (
    graphile,
    obanpy,
    pgqueuer_peer,
    procrastinate_peer,
    rss,
    scenarios,
)
from jobqueue.benchmarks.adapter import Drain, Peer
from jobqueue.benchmarks.peer_worker import HANDLERS, NOOP, PEER_BENCH_TABLE
from jobqueue.benchmarks.scenarios import check_bench_name, quantile
from jobqueue.testing import WorkerProcess, wait_for

logger = logging.getLogger(__name__)

GRAPHILE = graphile.SYSTEM
OBAN = obanpy.SYSTEM
PEERS = ("pgqueuer", "procrastinate", OBAN, GRAPHILE)
#: The `preset` column's names for the two setups the findings single out.
CLI_DEFAULTS = "CLI defaults"
PERFTEST = graphile.PERFTEST


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


async def _jobqueue_drain(url: str, setup: Mapping[str, Any], n: int, handler: str,
                          memory: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Its own CLI drain (`scenarios.cli_drain`, with its WAL and vacuum
    columns), or `scenarios.memory_timeline` as the CLI runs it."""
    flags = jobqueue_flags(setup)
    if memory:
        result = await scenarios.memory_timeline(url, n=n, flags=flags)
        return result["summary"], result["timeline"]
    return await scenarios.cli_drain(url, n=n, handler=handler, flags=flags,
                                     workers=int(setup.get("workers", 1))), []


async def _course_drain(url: str, setup: Mapping[str, Any], n: int, handler: str,
                        memory: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """In this process, timed by its own client clock: it has no worker process."""
    if handler != NOOP or memory:
        raise ValueError("the course design runs no-op drains only")
    (row,) = await scenarios.course_drains(url, n=n, repeat=1)
    row.pop("run", None)
    return {**row, "workers": 1, "argv": ""}, []


JOBQUEUE = Peer(
    system="jobqueue", label=scenarios.worker_label,
    argv=lambda setup, handler: scenarios.worker_argv(handler, *jobqueue_flags(setup)),
    truncate=f"{scenarios.TRUNCATE_JOBS}, jobqueue_workers",
    #: The batch ledger too: every quick batch overwrites its lane's row.
    tables=("jobs", "jobqueue_batches"),
    worker=lambda url, log, args, drain: WorkerProcess(url, log, *args),
    enqueue_one=lambda pool: lambda: pool.fetchval(
        "INSERT INTO jobs (job_type) VALUES ('noop') RETURNING id"),
    jobs_sql=("SELECT id, extract(epoch FROM created_at) AS enqueued,"
              " extract(epoch FROM started_at) AS started,"
              " extract(epoch FROM completed_at) AS completed FROM jobqueue_all_jobs"),
    preset=lambda args, workers: CLI_DEFAULTS if workers == 1 and len(args) == 2 and (
        args[0] == "--import") else "",
    own_drain=_jobqueue_drain, open=scenarios.open_bench,
    recommended=("The README starts it as `jobqueue worker --import MODULE` with the CLI's "
                 "defaults (2 lanes, batches of up to 1,000, quick batches); `--shared` lets "
                 "several processes work at once instead of one active and the others standing "
                 "by.", ()))
COURSE = Peer(system="course design",
              label=lambda args, workers: "a transaction per job, ORM, in-process",
              own_drain=_course_drain,
              recommended=("The course's own runner (`jobqueue/benchmarks/course.py`): a "
                           "transaction and ORM round trips per job, in the benchmark's "
                           "process.", ()))
_PEERS = {p.system: p for p in (JOBQUEUE, pgqueuer_peer.PEER, procrastinate_peer.PEER,
                                obanpy.PEER, graphile.PEER, COURSE)}
#: What each system's documentation advises for throughput (`Peer.recommended`).
RECOMMENDED = {system: p.recommended for system, p in _PEERS.items()}


def _peer(system: str) -> Peer:
    if system not in _PEERS:
        raise ValueError(f"unknown system {system!r}; one of {tuple(_PEERS)}")
    return _PEERS[system]


def available(system: str) -> bool:
    """Whether a system can run here (installed, or installable by the
    lab); one warning line otherwise."""
    return _peer(system).available()


def versions() -> dict[str, str]:
    """The installed peers' versions, for the results files' header."""
    return {k: v for p in _PEERS.values() for k, v in p.versions().items()}


def runnable(setups: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The setups whose system can run here (each system asked once)."""
    can = {system: available(system) for system in dict.fromkeys(s["system"] for s in setups)}
    return [s for s in setups if can[s["system"]]]


async def open_peer(system: str, name: str) -> str:
    """A new database of the system's own (`jobqueue_bench_<name>`), its
    schema installed by its own API, and the tasks' tables; its URL. Pair
    with `scenarios.close_bench(name)`."""
    peer = _peer(system)
    if peer.open is not None:
        return await peer.open(name)
    if not peer.available():
        raise ModuleNotFoundError(f"{system} cannot run here (see the warning above)")
    database = check_bench_name(f"{scenarios.LAB_DATABASE_PREFIX}{name}")
    url = await db.create_database(embedded.database_url(), database, replace=True)
    await peer.install(url)
    async with scenarios.connected(url) as conn:
        await conn.execute(PEER_BENCH_TABLE)
        await scenarios.create_demo_tables(conn)
    logger.info("%s installed in %s", system, database)
    return url


# -- setups and their labels -------------------------------------------------------


def argv(setup: Mapping[str, Any], handler: str = NOOP) -> list[str]:
    """The arguments a setup's worker processes get (graphile-worker's knobs
    as `name=value` words for its config file): the `argv` column."""
    return _peer(setup["system"]).argv(setup, handler)


def _words(args: str | Sequence[str]) -> list[str]:
    return shlex.split(args) if isinstance(args, str) else [str(a) for a in args]


def label(system: str, args: str | Sequence[str], workers: int = 1) -> str:
    """A setup as the tables show it, read back from its recorded `argv`."""
    return _peer(system).label(_words(args), workers)


def settings(setup: Mapping[str, Any], handler: str = NOOP) -> str:
    """The label a setup will get (`label` of its `argv`), before it runs."""
    return label(setup["system"], argv(setup, handler), int(setup.get("workers", 1)))


def preset(setup: Mapping[str, Any], args: str | Sequence[str] | None = None) -> str:
    """`CLI_DEFAULTS` for one jobqueue process given no flag but `--import`,
    `PERFTEST` for graphile-worker in its perfTest configuration, else
    empty; read from the arguments (`args`, as recorded, or the setup's)."""
    return _peer(setup["system"]).preset(_words(argv(setup) if args is None else args),
                                         int(setup.get("workers", 1)))


def comparison_setups(handler: str, *, processes: Sequence[int], pgqueuer_batch: int,
                      procrastinate_concurrency: int, procrastinate_n: int, course_n: int,
                      graphile_worker: bool = True, perftest: bool = False,
                      oban_limit: int | None = obanpy.DOCS_LIMIT) -> list[dict[str, Any]]:
    """The comparison's setups for one workload: every queue with each of
    `processes` worker processes as its docs advise (`RECOMMENDED`;
    jobqueue `--shared` beyond one; oban-py not if `oban_limit` is None),
    graphile-worker's whole perfTest (`perftest`), the course's design."""
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


async def _prepare(peer: Peer, url: str, handler: str, n: int = 0) -> Any:
    """Every run starts alike: the system's tables and the tasks' writes
    emptied, n jobs queued by its own batch API (`fill`'s result returned),
    VACUUM ANALYZE."""
    if handler not in HANDLERS:
        raise ValueError(f"unknown handler {handler!r}; one of {HANDLERS}")
    async with scenarios.connected(url) as conn:
        await conn.execute(peer.truncate)
        await scenarios.reset_writes(conn, handler)
    filled = await peer.fill(url, n, handler) if n else None
    async with scenarios.connected(url) as conn:
        for table in peer.tables:
            await conn.execute(f"VACUUM ANALYZE {table}")
    return filled


async def _drain(system: str, url: str, setup: Mapping[str, Any], *, n: int,
                 handler: str = NOOP, memory: bool = False, timeout: float = 900.0,
                 log_dir: Path | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One drain (or the system's `own_drain`): the row and the RSS timeline."""
    peer = _peer(system)
    if peer.own_drain is not None:
        return await peer.own_drain(url, setup, n, handler, memory)
    workers = int(setup.get("workers", 1))
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix=f"{system}-drain-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    filled = await _prepare(peer, url, handler, n)
    args = peer.argv(setup, handler)
    procs: list[WorkerProcess] = []
    try:
        async with scenarios.connected(url) as conn:
            procs = [peer.worker(url, log_dir / f"drain-{i}.log", args, True)
                     for i in range(workers)]
            async with rss.RssSampler(p.pid for p in procs) as sampler:
                first, last = await peer.drained(
                    Drain(system, conn, procs, filled, n, handler, timeout))
            await scenarios.check_writes(conn, handler, n, system)
    finally:
        for p in procs:
            p.close()
    seconds = last - first
    row = {"system": system, "argv": shlex.join(args), "settings": peer.label(args, workers),
           "n": n, "workers": workers, **peer.columns(args), "handler": handler,
           "seconds": seconds, "jobs_per_sec": n / seconds,
           **rss.summary(sampler.samples, first, last)}
    return row, rss.timeline(sampler.samples, first)


async def drain(system: str, url: str, *, n: int, workers: int = 1, batch_size: int = 10,
                concurrency: int | None = None, limit: int = obanpy.DOCS_LIMIT,
                handler: str = NOOP, timeout: float = 900.0, log_dir: Path | None = None
                ) -> dict[str, Any]:
    """One drain of a peer, its knobs by name; RuntimeError unless every job
    completed exactly once and wrote exactly its rows."""
    setup = {"system": system, "workers": workers, "batch_size": batch_size, "limit": limit,
             **({} if concurrency is None else {"concurrency": concurrency})}
    row, _ = await _drain(system, url, setup, n=n, handler=handler, timeout=timeout,
                          log_dir=log_dir)
    return row


# -- latency -----------------------------------------------------------------------

#: Seconds of arrivals at the start of each open-loop run left out of its figures.
WARMUP = scenarios.WARMUP_SECONDS


def carried(q: float, samples: int) -> bool:
    """Whether `samples` values carry the q-quantile: at least one value lies
    beyond it (p99 needs 100, p99.9 needs 1,000)."""
    return samples * (1 - q) >= 1 - 1e-9


def latencies(jobs: Sequence[tuple[float, float, float]], quantiles: Sequence[float]
              ) -> dict[str, float]:
    """`start_p50_ms`, `complete_p99_ms`, …: the quantiles of each job's
    enqueue-to-start and enqueue-to-completion, NaN where not `carried`."""
    out = {}
    for name, i in (("start", 1), ("complete", 2)):
        values = [t[i] - t[0] for t in jobs]
        for q in quantiles:
            out[f"{name}_{scenarios.quantile_name(q)}_ms"] = (quantile(values, q) * 1000
                                          if carried(q, len(values)) else float("nan"))
    return out


def latency_summary(rate: float, seconds: float, lateness: Sequence[float],
                    times: Sequence[tuple[float, float, float]], warmup: float = WARMUP
                    ) -> dict[str, Any]:
    """An open-loop run's figures from each job's (enqueued, started,
    completed) epoch seconds: the producer's rate over every arrival; the
    quantiles of the jobs enqueued `warmup` s or more after the first;
    `kept_up` unless their completions per second (`completed_rate`) fell
    behind the arrivals (a growing backlog worked off at its own pace)."""
    times = sorted(times)
    first = times[0][0]
    span = times[-1][0] - first
    counted = [t for t in times if t[0] - first >= warmup]
    achieved = (len(times) - 1) / span if span > 0 else float(len(times))
    summary: dict[str, Any] = {
        "rate": rate, "seconds": seconds, "warmup_s": warmup, "arrivals": len(times),
        "jobs": len(counted), "achieved_rate": achieved,
        "rate_met": achieved >= scenarios.MET_SHARE * rate,
        "producer_late_p99_ms": quantile(lateness, 0.99) * 1000}
    done = sorted(t[2] for t in counted)
    busy = done[-1] - done[0] if len(done) > 1 else 0.0
    summary["completed_rate"] = (len(done) - 1) / busy if busy > 0 else float("nan")
    summary["kept_up"] = not summary["completed_rate"] < scenarios.MET_SHARE * achieved
    return {**summary, **latencies(counted, scenarios.QUANTILES)}


class IdleWorker:
    """One system's worker process, up and idle (`idle_worker`), its
    producer, and a connection for the measurements."""

    def __init__(self, system: str, args: list[str], worker: WorkerProcess,
                 conn: asyncpg.Connection, enqueue_one: Any, warm_id: Any) -> None:
        self.system, self.args, self.worker, self.conn = system, args, worker, conn
        self.enqueue_one, self.warm_id = enqueue_one, warm_id
        self.peer = _peer(system)

    def alive(self) -> None:
        """RuntimeError, with its log, if the worker has exited."""
        if self.worker.proc.poll() is not None:
            raise RuntimeError(f"{self.system} worker exited: {self.worker.log()[-2000:]}")

    async def completed(self, count: int, warm: bool = False) -> bool:
        """Whether `count` jobs besides the first one (`warm`: the first one)
        are done; RuntimeError if the worker has exited."""
        self.alive()
        return bool(await self.conn.fetchval(
            f"SELECT count(*) FROM ({self.peer.jobs_sql}) AS j WHERE completed IS NOT NULL"
            f" AND id {'=' if warm else '<>'} $1", self.warm_id) >= count)

    async def wait_completed(self, count: int, timeout: float) -> None:
        await wait_for(lambda: self.completed(count), timeout=timeout, interval=0.05,
                       message=f"every {self.system} job completed")

    async def times(self) -> list[tuple[float, float, float]]:
        """Each completed job's (enqueued, started, completed) epoch seconds,
        from the system's own timestamps, the first job left out."""
        rows = await self.conn.fetch(
            f"SELECT * FROM ({self.peer.jobs_sql}) AS j WHERE id <> $1", self.warm_id)
        return [(float(r["enqueued"]), float(r["started"]), float(r["completed"]))
                for r in rows if r["completed"] is not None and r["started"] is not None]


@contextlib.asynccontextmanager
async def idle_worker(system: str, url: str, setup: Mapping[str, Any] | None = None, *,
                      connections: int = 8, log_dir: Path | None = None
                      ) -> AsyncIterator[IdleWorker]:
    """The system's tables emptied, one worker process (continuous mode,
    woken by its LISTEN/NOTIFY) and a producer (`enqueue_one` over an
    asyncpg pool). A first job, completed before this yields, proves the
    worker up; `IdleWorker` leaves it out of everything it counts."""
    peer = _peer(system)
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix=f"{system}-latency-"))
    args = peer.argv({"system": system, **(setup or {})}, NOOP)
    await _prepare(peer, url, NOOP)
    pool = await asyncpg.create_pool(**db.asyncpg_connect_args(url), min_size=connections,
                                     max_size=connections)
    conn = await db.connect(url, application_name="jobqueue bench")
    worker = peer.worker(url, log_dir / "worker.log", args, False)
    try:
        enqueue_one = peer.enqueue_one(pool)
        warm = await enqueue_one()
        running = IdleWorker(system, args, worker, conn, enqueue_one,
                             warm[0] if isinstance(warm, list) else warm)
        await wait_for(lambda: running.completed(1, warm=True), timeout=60,
                       message=f"{system}'s worker to finish a first job")
        yield running
    finally:
        await pool.close()
        await worker.stop()
        await conn.close()


async def open_loop(system: str, url: str, *, rate: float, seconds: float,
                    setup: Mapping[str, Any] | None = None, connections: int = 8,
                    warmup: float = WARMUP, log_dir: Path | None = None) -> dict[str, Any]:
    """Arrivals at `rate` jobs/s for `warmup` + `seconds` to one idle worker,
    each in its own transaction at its scheduled time: the summary
    (`latency_summary`, tagged) and the counted jobs' latencies (s)."""
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


# -- the comparison: setups run one after another, repeated --------------------------


async def drain_setup(urls: Mapping[str, str], setup: Mapping[str, Any], *, n: int,
                      handler: str = NOOP) -> dict[str, Any]:
    """One drain of `setup.get("n", n)` jobs (the course design in jobqueue's
    database), `settings` and `preset` read back from its recorded `argv`."""
    system = setup["system"]
    workers = int(setup.get("workers", 1))
    row, _ = await _drain(system, urls[system if system in urls else "jobqueue"], setup,
                          n=int(setup.get("n", n)), handler=handler)
    return {**row, "system": system, "settings": label(system, row["argv"], workers),
            "preset": preset(setup, row["argv"])}


def _rounds(setups: Sequence[Mapping[str, Any]], what: str, repeat: int = 1,
            rates: Sequence[float] = (0.0,)) -> Iterator[tuple[int, float, Mapping[str, Any]]]:
    """(run, rate, setup) for every runnable setup at every rate, `repeat`
    rounds of all of them in turn, so that a slow spell of the machine hits
    them all, not one system's runs; a progress step after each."""
    setups = runnable(setups)
    with scenarios.progress(len(setups) * len(rates) * repeat, what) as bar:
        for run in range(1, repeat + 1):
            for rate in rates:
                for setup in setups:
                    yield run, rate, setup
                    bar.update()


async def drain_comparison(urls: Mapping[str, str], setups: Sequence[Mapping[str, Any]], *,
                           n: int, repeat: int, handler: str = NOOP) -> list[dict[str, Any]]:
    """`drain_setup` of every setup, `repeat` rounds (`_rounds`)."""
    return [{**await drain_setup(urls, setup, n=n, handler=handler), "run": run}
            for run, _, setup in _rounds(setups, f"drain ({handler})", repeat)]


async def latency_comparison(urls: Mapping[str, str], setups: Sequence[Mapping[str, Any]], *,
                             rates: Sequence[float], seconds: float, repeat: int,
                             warmup: float = WARMUP
                             ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Open-loop runs (`open_loop`) of every setup at every rate, `repeat`
    rounds: the summaries, and every counted job's latencies (ms)."""
    summaries, samples = [], []
    for run, rate, setup in _rounds(setups, "latency", repeat, rates):
        system = setup["system"]
        result = await open_loop(system, urls[system], rate=rate, seconds=seconds, setup=setup,
                                 warmup=warmup)
        summary = result["summary"]
        summaries.append({**summary, "run": run})
        samples += [{"system": system, "settings": summary["settings"], "rate": rate,
                     "run": run, "to_start_ms": s * 1000, "to_complete_ms": c * 1000}
                    for s, c in zip(result["to_start"], result["to_complete"], strict=True)]
    return summaries, samples


async def memory_comparison(urls: Mapping[str, str], setups: Sequence[Mapping[str, Any]]
                            ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One long drain per setup (its own `n`), one worker, RSS sampled: the
    summaries (with the change per 10,000 jobs) and the timelines."""
    summaries, timelines = [], []
    for _, _, setup in _rounds(setups, "memory"):
        system, n = setup["system"], int(setup["n"])
        row, timeline = await _drain(system, urls[system], {**setup, "workers": 1}, n=n,
                                     memory=True, timeout=3600.0)
        tags = {"system": system, "settings": label(system, row["argv"])}
        growth = row["rss_end_mib"] - row["rss_start_mib"]
        summaries.append({**row, **tags, "rss_per_10k_jobs_mib": growth / n * 10_000})
        timelines += [{**tags, "n": n, "drain_seconds": row["seconds"], **point}
                      for point in timeline]
    return summaries, timelines
