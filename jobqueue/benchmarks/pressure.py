"""Pressure: what a queue's latency does while vacuum cannot run.

A finished job leaves dead row versions that vacuum may remove only once no
transaction could still see them; one open transaction pins the xmin
horizon, and every claim then steps over more and more of them.

`run` takes one system (one idle worker, `peers.idle_worker`) through
`PHASES` while jobs arrive one by one at scheduled times (as
`peers.open_loop`). A phase holds back vacuum with a session idle in a
transaction with an xid (`holder`), REPEATABLE READ sessions scanning the
system's tables (`readers`), or arrivals at a multiple of what the worker
sustains (`load`, capped at what one producer sends); phases that keep the
holder or readers keep the same sessions, so the horizon stays where it was
first pinned. A sampler reads the system's waits, its tables' dead tuples
and sizes, the readers and the horizon's holder; for jobqueue each phase
ends with `EXPLAIN (ANALYZE, BUFFERS)` of its claim. Latencies come from
each system's own timestamps, per phase and per window.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import math
import shlex
import tempfile
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import asyncpg

from jobqueue import db
from jobqueue.benchmarks import obanpy, peers, rss, scenarios
from jobqueue.benchmarks.scenarios import quantile
from jobqueue.ops import horizon
from jobqueue.schema.queries import queries
from jobqueue.worker import DEFAULT_BATCH_SIZE

logger = logging.getLogger(__name__)

HOLDER = "pressure holder"
READER = "pressure reader"
SAMPLER = "pressure sampler"
PROBE = "pressure probe"
#: The systems measured, one worker process each, as the comparison's latency
#: runs configure them (PgQueuer at jobqueue's batch ceiling; Procrastinate's
#: drain smaller: it sustains a few hundred jobs/s).
SETUPS: tuple[dict[str, Any], ...] = (
    {"system": "jobqueue", "flags": []},
    {"system": "pgqueuer", "batch_size": DEFAULT_BATCH_SIZE},
    {"system": "procrastinate", "concurrency": 30, "n": 600},
    {"system": "oban-py", "limit": obanpy.DOCS_LIMIT, "n": 5_000},
)


@dataclass(frozen=True)
class Phase:
    """`seconds` with the holder or not, `readers` readers, and arrivals at
    `load` × the sustained rate (None: the base rate)."""

    name: str
    seconds: float
    holder: bool = False
    readers: int = 0
    load: float | None = None

    @property
    def pinned(self) -> bool:
        return self.holder or self.readers > 0


#: The issue's phases: a baseline, the holder alone, readers beside it, 1.5×
#: what the worker sustains with both still there, then everything released.
#: The seconds are the full size's (`make bench`); see the notebook. The
#: holder alone lasts 120 s: what `GOAL` is judged on (issue 49).
PHASES: tuple[dict[str, Any], ...] = (
    {"name": "baseline", "seconds": 30},
    {"name": "holder", "seconds": 120, "holder": True},
    {"name": "readers", "seconds": 30, "holder": True, "readers": 4},
    {"name": "load", "seconds": 30, "holder": True, "readers": 4, "load": 1.5},
    {"name": "recovery", "seconds": 30},
)
#: `make bench-pinned` (`pinned.py`): jobqueue alone, the holder alone for
#: 120 s after a baseline: the check of `GOAL` that a change to the claims or
#: the chores runs before it lands (about four minutes).
PINNED_PHASES: tuple[dict[str, Any], ...] = (
    {"name": "baseline", "seconds": 50},
    {"name": "holder", "seconds": 120, "holder": True},
    {"name": "recovery", "seconds": 10},
)
#: The promise (issue 49): with the horizon pinned by one idle transaction,
#: p50 and p99 of the jobs enqueued in the last `Config.late` seconds of the
#: holder phase at most this many times the baseline's.
GOAL = 1.5
#: `make bench-pressure`: the horizon pinned for 10 minutes (the goal the
#: pressure benchmark was written for), the readers for most of it.
LONG_PHASES: tuple[dict[str, Any], ...] = (
    {"name": "baseline", "seconds": 60},
    {"name": "holder", "seconds": 120, "holder": True},
    {"name": "readers", "seconds": 390, "holder": True, "readers": 4},
    {"name": "load", "seconds": 90, "holder": True, "readers": 4, "load": 1.5},
    {"name": "recovery", "seconds": 60},
)


def phases(spec: Sequence[Mapping[str, Any] | Phase]) -> tuple[Phase, ...]:
    """Phases from their dicts (`PHASES`, or JSON from
    `JOBQUEUE_BENCH_PRESSURE_PHASES`); ValueError naming the first mistake."""
    known = {f.name for f in fields(Phase)}
    out = []
    for i, item in enumerate(spec):
        if isinstance(item, Phase):
            out.append(item)
            continue
        unknown = sorted(set(item) - known)
        if unknown or "name" not in item or "seconds" not in item:
            raise ValueError(f"phase {i + 1}: needs name and seconds, may have "
                             f"holder, readers, load; got {sorted(item)}")
        phase = Phase(**item)
        if not (phase.seconds > 0 and phase.readers >= 0
                and (phase.load is None or phase.load > 0)):
            raise ValueError(f"phase {phase.name!r}: seconds and load must be positive, "
                             "readers not negative")
        out.append(phase)
    if not out:
        raise ValueError("no phases")
    return tuple(out)


def with_seconds(spec: Sequence[Mapping[str, Any]], seconds: float) -> list[dict[str, Any]]:
    """The same phases, each `seconds` long (the smoke size)."""
    return [{**item, "seconds": seconds} for item in spec]


@dataclass(frozen=True)
class Config:
    """A pressure run's sizes (the notebook's parameters). rate: jobs/s
    outside the load phases, at most base_share × what the system sustains
    (so its baseline is no backlog); max_rate: the load phases' cap, what one
    producer sends; sustained: each system's rate given instead of measured
    by a drain of drain_n jobs (the smoke size, whose drains would measure
    start-up); window: the timeline's step; late: each phase's last seconds,
    whose jobs' latencies `GOAL` judges (`late_p50_ms`, `late_p99_ms`);
    settle: seconds the last jobs may take after the last phase; max_behind:
    `_Sender`."""

    phases: tuple[Phase, ...] = field(default_factory=lambda: phases(PHASES))
    rate: float = 500.0
    max_rate: float = 1000.0
    base_share: float = 0.7
    drain_n: int = 20_000
    sustained: Mapping[str, float] | None = None
    interval: float = 0.5
    window: float = 5.0
    warmup: float = peers.WARMUP
    late: float = 40.0
    reader_pause: float = 0.5
    settle: float = 300.0
    max_behind: float = 1.0
    connections: int = 8
    top_waits: int = 3

    def rate_of(self, phase: Phase, sustained: float) -> float:
        if phase.load is None:
            return min(self.rate, self.base_share * sustained)
        return min(phase.load * sustained, self.max_rate)


# -- what holds back vacuum ------------------------------------------------------

#: What a phase ends with besides the samples (`PROBES`).
Probe = Callable[[asyncpg.Connection], Awaitable[dict[str, Any]]]


class _Pressure:
    """One system's phases (`run`): the holder and the readers brought to
    what each asks (`apply`), the producer running through them all, the
    sampler (`ticks`) and the probe meanwhile. Per phase: its start on the
    database's clock (`bounds`, and the end), the probe at its end, its
    arrivals' lateness and drops."""

    def __init__(self, url: str, tables: Sequence[str], config: Config, probe: Probe | None
                 ) -> None:
        self.url, self.tables, self.config, self._probe = url, tables, config, probe
        self.holder: asyncpg.Connection | None = None
        self.readers: list[tuple[asyncio.Task[None], asyncio.Event]] = []
        self.ticks: list[dict[str, Any]] = []
        self.bounds: list[float] = []
        self.probes: list[dict[str, Any]] = []
        self.lateness: list[list[float]] = []
        self.dropped: list[int] = []
        #: When each change of phase began (`bounds`: when it was done);
        #: samples that overlap a change count for no phase.
        self.changes: list[float] = []

    async def __aenter__(self) -> _Pressure:
        self.sampler = asyncio.create_task(self._sample())
        self.probe_conn = await db.connect(self.url, application_name=PROBE)
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.apply(None)
        finally:
            self.sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.sampler
            await self.probe_conn.close()

    async def run(self, running: peers.IdleWorker, rates: Sequence[float], steps: Any) -> None:
        """The phases on the loop's clock, the producer running through them all."""
        loop, phase_list, clock = asyncio.get_running_loop(), self.config.phases, running.conn
        offsets = [0.0, *itertools.accumulate(float(p.seconds) for p in phase_list)]
        counts = [max(1, round(r * p.seconds)) for r, p in zip(rates, phase_list, strict=True)]
        schedule = [offsets[i] + k / rates[i] for i, n in enumerate(counts) for k in range(n)]
        sender = _Sender(running.enqueue_one, counts, rates, self.config.max_behind)
        await self.apply(phase_list[0])
        self.bounds.append(await _now(clock))
        start = loop.time()
        producer = asyncio.create_task(scenarios.arrivals_at(sender, schedule, start))
        try:
            for i in range(1, len(phase_list) + 1):
                await asyncio.wait([producer], timeout=max(0.0, start + offsets[i] - loop.time()))
                if producer.done() and producer.exception() is not None:
                    await producer
                running.alive()
                self.probes.append(await self._probe(self.probe_conn) if self._probe else {})
                if i < len(phase_list):
                    self.changes.append(await _now(clock))
                    await self.apply(phase_list[i])
                self.bounds.append(await _now(clock))
                if steps is not None:
                    steps.update()
            await self.apply(None)
            lateness = await producer
        finally:
            if not producer.done():
                producer.cancel()
        cut = [sum(counts[:i]) for i in range(len(counts) + 1)]
        self.lateness = [lateness[cut[i]:cut[i + 1]] for i in range(len(counts))]
        self.dropped = sender.dropped

    async def _sample(self) -> None:
        conn = await db.connect(self.url, application_name=SAMPLER)
        try:
            while True:
                self.ticks.append(await _sample(conn, self.tables))
                await asyncio.sleep(self.config.interval)
        finally:
            await conn.close()

    async def apply(self, phase: Phase | None) -> None:
        want_holder = phase is not None and phase.holder
        want_readers = phase.readers if phase is not None else 0
        if want_holder and self.holder is None:
            self.holder = await db.connect(self.url, application_name=HOLDER)
            await self.holder.execute("BEGIN")
            await self.holder.fetchval("SELECT pg_current_xact_id()")
        elif not want_holder and self.holder is not None:
            holder, self.holder = self.holder, None
            await holder.execute("ROLLBACK")
            await holder.close()
        while len(self.readers) > want_readers:
            task, stop = self.readers.pop()
            stop.set()
            await task
        while len(self.readers) < want_readers:
            stop, began = asyncio.Event(), asyncio.Event()
            task = asyncio.create_task(self._read(stop, began))
            self.readers.append((task, stop))
            waiter = asyncio.create_task(began.wait())
            await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            if task.done():
                await task  # it failed before its first scan: say why

    async def _read(self, stop: asyncio.Event, began: asyncio.Event) -> None:
        conn = await db.connect(self.url, application_name=READER)
        try:
            await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            while not stop.is_set():
                for table in self.tables:
                    await conn.fetchval(f"SELECT count(*) FROM {table}")
                began.set()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.config.reader_pause)
            await conn.execute("COMMIT")
        finally:
            await conn.close()


# -- what the database says meanwhile --------------------------------------------

#: What the system's sessions wait on (not the pressure's own): each active
#: backend once, `CPU` where it waits on nothing (running, or in code no wait
#: event covers); autovacuum workers included.
_WAITS = """
    SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU') AS wait, count(*) AS n
    FROM pg_stat_activity
    WHERE datname = current_database() AND pid <> pg_backend_pid()
      AND (state = 'active' OR backend_type = 'autovacuum worker')
      AND application_name NOT LIKE 'pressure %'
    GROUP BY 1"""
_READERS = """
    SELECT count(*) FROM pg_stat_activity
    WHERE datname = current_database() AND application_name = $1
      AND backend_xmin IS NOT NULL"""
_TABLES = """
    SELECT extract(epoch FROM clock_timestamp()) AS at, relname AS name,
           n_dead_tup AS dead, n_live_tup AS live,
           pg_total_relation_size(relid) AS total_bytes, pg_indexes_size(relid) AS index_bytes
    FROM pg_stat_user_tables WHERE relname = ANY($1::text[])"""


async def _sample(conn: asyncpg.Connection, tables: Sequence[str]) -> dict[str, Any]:
    rows = await conn.fetch(_TABLES, list(tables))
    holder = await horizon.oldest(conn)
    waits = {r["wait"]: int(r["n"]) for r in await conn.fetch(_WAITS)}
    # A sample takes a few statements; one that a phase's start falls within
    # saw some of each phase, and belongs to neither (`phase_rows`).
    return {"at": float(rows[0]["at"]) if rows else await _now(conn),
            "until": await _now(conn),
            "tables": {r["name"]: (int(r["dead"]), int(r["live"]), int(r["total_bytes"]),
                                   int(r["index_bytes"])) for r in rows},
            "horizon": holder, "waits": waits,
            "readers": int(await conn.fetchval(_READERS, READER))}


async def _now(conn: asyncpg.Connection) -> float:
    return float(await conn.fetchval("SELECT extract(epoch FROM clock_timestamp())"))


async def _explain(conn: asyncpg.Connection, sql: str, *args: Any) -> tuple[float, int, int]:
    """`sql` under EXPLAIN (ANALYZE, BUFFERS) in a transaction rolled back:
    its execution time (ms), the buffers the whole plan read (shared hit +
    read) and the rows it returned (a `take`: the jobs it locked, not the
    rows that only say where its empty arms' next claims start)."""
    await conn.execute("BEGIN")
    try:
        raw = await conn.fetchval("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, *args)
    finally:
        await conn.execute("ROLLBACK")
    plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]
    top = plan["Plan"]
    taken = next((c for c in top.get("Plans", []) if c.get("Subplan Name") == "CTE taken"), top)
    return (float(plan["Execution Time"]),
            int(top.get("Shared Hit Blocks", 0)) + int(top.get("Shared Read Blocks", 0)),
            int(taken["Actual Rows"]))


#: A lane's row in the batch ledger, which its next batch replaces (`record_batch`).
_LEDGER_ROW = "SELECT ctid, worker_id, lane, xid FROM jobqueue_batches LIMIT 1"


#: Where a lane's floor would be now in each of the worker's types: the
#: first waiting job (read from the front, so it steps over every dead entry
#: itself; the probe's, untimed), or, where none waits, now(): where the
#: lane's last claim there said its next one starts.
_FLOORS = """
    SELECT t.job_type, coalesce(w.run_at, now()) AS run_at, w.id
    FROM unnest(CAST($1 AS text[])) AS t(job_type)
    LEFT JOIN LATERAL (
        SELECT run_at, id FROM jobs
        WHERE queue = 'default' AND job_type = t.job_type AND priority = 0
          AND status IN ('pending', 'retrying')
        ORDER BY run_at, id LIMIT 1) AS w ON true"""

#: The job types the system's worker takes, as it registered them: each is
#: one arm of every claim it sends.
_WORKER_TYPES = ("SELECT job_types FROM jobqueue_workers "
                 "ORDER BY started_at DESC LIMIT 1")


async def explain_take(conn: asyncpg.Connection, limit: int = DEFAULT_BATCH_SIZE
                       ) -> dict[str, Any]:
    """What one claim costs now: jobqueue's `take` as a lane of the worker
    sends it, with an arm for each type the worker has a handler for, each
    from its floor (`_explain`: ms, buffers, rows locked), and the same from
    the front of the index (`front_*`: what a worker's first claim of a life
    reads); and what a lane's write to the batch ledger costs (`ledger_*`,
    `record_batch`; NaN before the first batch). Until issue 49 the probe
    sent one arm, and missed what the worker's other arms read."""
    take = queries["take"]
    types = list(await conn.fetchval(_WORKER_TYPES) or ["noop"])
    floors = await conn.fetch(_FLOORS, types)
    values = {"queue": "default", "arm_types": [f["job_type"] for f in floors],
              "limit": limit, "priorities": [0] * len(floors)}
    ms, buffers, rows = await _explain(conn, take.positional, *take.args(
        {**values, "floors": [f["run_at"] for f in floors],
         "floor_ids": [f["id"] for f in floors]}))
    front_ms, front_buffers, _ = await _explain(conn, take.positional, *take.args(
        {**values, "floors": [None] * len(floors), "floor_ids": [None] * len(floors)}))
    out: dict[str, Any] = {"take_ms": ms, "take_buffers": buffers, "take_rows": rows,
                           "take_arms": len(floors),
                           "front_ms": front_ms, "front_buffers": front_buffers,
                           "ledger_ms": math.nan, "ledger_buffers": math.nan}
    row = await conn.fetchrow(_LEDGER_ROW)
    if row is not None:  # the lane's next `record_batch`, rolled back
        record = queries["record_batch"]
        out["ledger_ms"], out["ledger_buffers"], _ = await _explain(
            conn, record.positional, *record.args({
                "previous": row["ctid"], "worker_id": row["worker_id"], "lane": row["lane"],
                "xid": -row["xid"], "ids": []}))
    return out


#: What each system's phases end with besides the samples.
PROBES: dict[str, Probe] = {"jobqueue": explain_take}


# -- one system through the phases ------------------------------------------------


async def run(system: str, url: str, setup: Mapping[str, Any], config: Config,
              steps: Any = None) -> dict[str, Any]:
    """One system through `config.phases`: `rows` (per phase), `timeline`
    and `waits` (per phase), tagged with `TAG_COLUMNS`."""
    setup = {"system": system, **setup}
    rate = (config.sustained or {}).get(system)
    if rate is None:  # what the worker sustains: a drain of no-op jobs already queued
        rate = (await peers.drain_setup({system: url}, setup, n=config.drain_n))["jobs_per_sec"]
    rate = float(rate)
    if steps is not None:
        steps.update()
    rates = [config.rate_of(phase, rate) for phase in config.phases]
    log_dir = Path(tempfile.mkdtemp(prefix=f"{system}-pressure-"))
    async with peers.idle_worker(system, url, setup, connections=config.connections,
                                 log_dir=log_dir) as running:
        async with _Pressure(url, running.peer.tables, config, PROBES.get(system)) as sent:
            await sent.run(running, rates, steps)
        ticks = sent.ticks
        total = sum(len(x) for x in sent.lateness) - sum(sent.dropped)
        try:
            await running.wait_completed(total, timeout=config.settle)
        except TimeoutError:  # a system that fell behind for good: said, not fatal
            logger.warning("%s: jobs still waiting %.0f s after the last phase", system,
                           config.settle)
        times = await running.times()
        args = running.args
    tags = dict(zip(TAG_COLUMNS, (system, shlex.join(args), peers.label(system, args),
                                  max(0, total - len(times))), strict=True))
    return {"rows": [{**tags, **row} for row in phase_rows(config, rates, rate, sent, times,
                                                          ticks)],
            "timeline": [{**tags, **row}
                         for row in timeline_rows(config, sent.bounds, times, ticks)],
            "waits": [{**tags, **row} for row in wait_rows(config.phases, sent.bounds, ticks)]}


class _Sender:
    """The producer's `enqueue_one`, which drops an arrival while more than
    `max_behind` seconds of its phase's arrivals wait to be sent: sent late,
    they would fall into the phases after. The n-th call is the n-th arrival."""

    def __init__(self, enqueue_one: Callable[[], Awaitable[Any]], counts: Sequence[int],
                 rates: Sequence[float], max_behind: float) -> None:
        self.enqueue_one = enqueue_one
        self.phase_of = [i for i, n in enumerate(counts) for _ in range(n)]
        self.limits = [max(1, math.ceil(r * max_behind)) for r in rates]
        self.dropped = [0] * len(counts)
        self.calls = self.pending = 0

    async def __call__(self) -> None:
        phase = self.phase_of[self.calls]
        self.calls += 1
        if self.pending >= self.limits[phase]:
            self.dropped[phase] += 1
            return
        self.pending += 1
        try:
            await self.enqueue_one()
        finally:
            self.pending -= 1


# -- figures ------------------------------------------------------------------------


def _phase_of(at: float, bounds: Sequence[float]) -> int:
    """The phase a database time falls in (the last one runs on)."""
    for i in range(len(bounds) - 2, -1, -1):
        if at >= bounds[i]:
            return i
    return 0


def _stretch(jobs: Sequence[tuple[float, float, float]], done: int, seconds: float,
             ticks: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A phase's or window's figures: the latencies of the jobs enqueued in
    it, its completions per second, its last sample's tables and horizon,
    the readers seen."""
    tick = ticks[-1] if ticks else None
    tables = {} if tick is None else tick["tables"]
    h = None if tick is None else tick["horizon"]

    def total(i: int, scale: float = 1) -> float:
        return sum(t[i] for t in tables.values()) / scale if tick else math.nan

    return {"jobs": len(jobs), "completed_per_s": done / seconds if seconds > 0 else math.nan,
            **peers.latencies(jobs, (0.5, 0.99)),
            "complete_max_ms": max((t[2] - t[0] for t in jobs), default=math.nan) * 1000,
            "dead_tuples": total(0), "live_tuples": total(1), "total_mib": total(2, rss.MIB),
            "index_mib": total(3, rss.MIB),
            "dead_by_table": ", ".join(f"{name} {t[0]:,}" for name, t in sorted(tables.items())),
            "horizon": "" if h is None else h.name or h.kind,
            "horizon_age_s": math.nan if h is None or h.age_seconds is None else h.age_seconds,
            "horizon_xid_age": math.nan if h is None else h.xid_age,
            "readers_seen": max((k["readers"] for k in ticks), default=0)}


def _late(jobs: Sequence[tuple[float, float, float]]) -> dict[str, float]:
    """p50 and p99 from enqueue to completion of a phase's last jobs."""
    got = peers.latencies(jobs, (0.5, 0.99))
    return {"late_jobs": len(jobs), "late_p50_ms": got["complete_p50_ms"],
            "late_p99_ms": got["complete_p99_ms"]}


def goal_rows(rows: Sequence[Mapping[str, Any]], goal: float = GOAL) -> list[dict[str, Any]]:
    """For each system, `GOAL` judged: p50 and p99 of the jobs enqueued late
    in its first phase held by the holder alone, each ÷ the same of its first
    phase (the baseline), and whether both are within `goal`."""
    out = []
    for system in dict.fromkeys(r["system"] for r in rows):
        mine = sorted((r for r in rows if r["system"] == system), key=lambda r: r["order"])
        held = next((r for r in mine if r["holder"] and not r["readers"]
                     and not _given(r["load"]) and "late_p50_ms" in r), None)
        if held is None:
            continue  # no phase held by the holder alone (or a run from before issue 49)
        base = mine[0]
        ratios = {q: held[f"late_{q}_ms"] / base[f"complete_{q}_ms"] for q in ("p50", "p99")}
        out.append({"system": system, "phase": held["phase"], "seconds": held["seconds"],
                    "late_jobs": held["late_jobs"],
                    "baseline_p50_ms": base["complete_p50_ms"], "late_p50_ms": held["late_p50_ms"],
                    "p50_ratio": ratios["p50"],
                    "baseline_p99_ms": base["complete_p99_ms"], "late_p99_ms": held["late_p99_ms"],
                    "p99_ratio": ratios["p99"], "goal": goal,
                    "met": bool(all(v <= goal for v in ratios.values()))})
    return out


def _given(value: Any) -> bool:
    """A value a row has (read back from a results file, a missing one is NaN)."""
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def phase_rows(config: Config, rates: Sequence[float], sustained_rate: float, sent: _Pressure,
               times: Sequence[tuple[float, float, float]],
               ticks: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per phase: its arrivals, the rate they came at, those the
    producer dropped, `_stretch` (warm-up left out; the samples that
    overlap no phase change), the horizon's holder share, the top wait
    events, what the probe read at its end."""
    bounds, lateness = sent.bounds, sent.lateness
    first = bounds[0]
    rows = []
    for i, phase in enumerate(config.phases):
        lo, hi = bounds[i], bounds[i + 1]
        arrived = [t for t in times if _phase_of(t[0], bounds) == i]
        end = sent.changes[i] if i < len(sent.changes) else math.inf
        mine = [k for k in ticks if lo <= k["at"] and k.get("until", k["at"]) < end]
        waits: Counter[str] = Counter()
        for k in mine:
            waits.update(k["waits"])
        span = max((t[0] for t in arrived), default=lo) - min((t[0] for t in arrived), default=lo)
        achieved = (len(arrived) - 1) / span if span > 0 else math.nan
        held = sum(k["horizon"] is not None and k["horizon"].name == HOLDER for k in mine)
        rows.append({
            "phase": phase.name, "order": i + 1, "seconds": phase.seconds,
            "start_s": lo - first, "end_s": hi - first, "holder": phase.holder,
            "readers": phase.readers, "load": phase.load, "pinned": phase.pinned,
            "sustained": sustained_rate, "rate": rates[i],
            "capped": phase.load is not None and rates[i] < phase.load * sustained_rate,
            "arrivals": len(arrived), "dropped": sent.dropped[i], "achieved_rate": achieved,
            "rate_met": bool(achieved >= scenarios.MET_SHARE * rates[i]),
            "producer_late_p99_ms": quantile(lateness[i], 0.99) * 1000 if lateness[i] else 0.0,
            **_stretch([t for t in arrived if t[0] >= first + config.warmup],
                       sum(lo <= t[2] < hi for t in times), hi - lo, mine),
            **_late([t for t in arrived if t[0] >= max(first + config.warmup,
                                                       hi - config.late)]),
            "holder_share": held / len(mine) if mine else math.nan, "samples": len(mine),
            "top_waits": ", ".join(f"{w} {n}" for w, n in waits.most_common(config.top_waits)),
            **sent.probes[i],
        })
    return rows


def timeline_rows(config: Config, bounds: Sequence[float],
                  times: Sequence[tuple[float, float, float]],
                  ticks: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per `config.window` seconds from the first phase's start: the
    phase it began in and its `_stretch`."""
    first, end, step = bounds[0], bounds[-1], config.window
    count = max(1, round((end - first) / step))  # no sliver of a window at the end

    def bucket(at: float) -> int:
        w = math.floor((at - first) / step)
        return w if 0 <= w < count else count

    enqueued: list[list[tuple[float, float, float]]] = [[] for _ in range(count + 1)]
    done = [0] * (count + 1)
    sampled: list[list[dict[str, Any]]] = [[] for _ in range(count + 1)]
    for t in times:
        if t[0] >= first + config.warmup:
            enqueued[bucket(t[0])].append(t)
        done[bucket(t[2])] += 1
    for k in ticks:
        sampled[bucket(k["at"])].append(k)
    return [{"t": w * step, "phase": config.phases[_phase_of(first + w * step, bounds)].name,
             **_stretch(enqueued[w], done[w], step, sampled[w])} for w in range(count)]


#: What tags every row of a run; the waits file has its columns even empty.
TAG_COLUMNS = ("system", "argv", "settings", "unfinished")
WAIT_COLUMNS = (*TAG_COLUMNS, "phase", "wait", "count")


def wait_rows(phase_list: Sequence[Phase], bounds: Sequence[float],
              ticks: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every wait event seen, counted per phase (one count per backend per sample)."""
    counts: dict[int, Counter[str]] = {i: Counter() for i in range(len(phase_list))}
    for k in ticks:
        counts[_phase_of(k["at"], bounds)].update(k["waits"])
    return [{"phase": phase_list[i].name, "wait": wait, "count": n}
            for i, c in counts.items() for wait, n in c.most_common()]


# -- every system, one after another --------------------------------------------------


def _database(system: str, prefix: str) -> str:
    return prefix if system == "jobqueue" else f"{prefix}_{system.replace('-', '_')}"


async def open_databases(systems: Sequence[str], prefix: str = "pressure") -> dict[str, str]:
    """A database for each system (`jobqueue_bench_<prefix>[_<system>]`),
    its schema installed (`peers.open_peer`): their URLs."""
    return {system: await peers.open_peer(system, _database(system, prefix))
            for system in systems}


async def close_databases(systems: Sequence[str], prefix: str = "pressure") -> None:
    for system in systems:
        await scenarios.close_bench(_database(system, prefix))


#: What a pressure run gives: one dict a row.
Rows = list[dict[str, Any]]


async def comparison(urls: Mapping[str, str], setups: Sequence[Mapping[str, Any]],
                     config: Config, keep: Callable[[Rows, Rows, Rows], None] | None = None
                     ) -> tuple[Rows, Rows, Rows]:
    """`run` for every setup that can run here, one after another. `keep` gets
    what is done so far after each system: a full run takes most of an hour
    a system, and a peer that fails late must not take those before it down."""
    setups = peers.runnable(setups)
    rows: Rows = []
    timeline: Rows = []
    waits: Rows = []
    with scenarios.progress(len(setups) * (len(config.phases) + 1), "pressure") as bar:
        for setup in setups:
            system = setup["system"]
            result = await run(system, urls[system],
                               {k: v for k, v in setup.items() if k != "system"}, config, bar)
            rows += result["rows"]
            timeline += result["timeline"]
            waits += result["waits"]
            if keep is not None:
                keep(rows, timeline, waits)
    return rows, timeline, waits


def settings_of(config: Config) -> dict[str, str]:
    """The run's sizes for the results files' header."""
    values = asdict(config)
    values["phases"] = json.dumps([{k: v for k, v in asdict(p).items() if v not in (None, 0)
                                    or k in ("name", "seconds")} for p in config.phases])
    return {f"pressure_{k}": str(v) for k, v in values.items()}
