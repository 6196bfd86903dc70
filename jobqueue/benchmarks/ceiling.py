"""Where a job's time goes: `python -m jobqueue.benchmarks.ceiling`.

The README's "where the time went" as a command anyone can rerun. Each row
does one thing N times, against a database of its own, and reports the time
per job (wall clock, this process's CPU, and the server backend's CPU when
the server runs on this machine), the median of R runs: the raw costs a job
can pay (a round trip, an INSERT in an open transaction, with a savepoint
released or kept as jobqueue's are, committed on its own as a queue whose
handlers write through their own pool pays); the same INSERT through
SQLAlchemy sessions, jobqueue's before (a session per job with SQLAlchemy's
savepoints) and now (the handler's session of a running worker, with
`savepoints="always"` and `"auto"`); and the queue's own statements for a
batch of no-op jobs, claim then complete against take and complete in one
(`queries.sql`). Figures vary from run to run on a shared machine; compare
rows of one run. `--save` writes `ceiling.csv` for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, create_async_engine

from jobqueue import HandlerRegistry, JobRunner, db, embedded
from jobqueue.benchmarks import save, scenarios
from jobqueue.eventloop import LOOPS, loop_factory
from jobqueue.schema.queries import queries
from jobqueue.worker.batch import split

INSERT = "INSERT INTO bench_rows (job_id) VALUES ($1)"
INSERT_SA = text("INSERT INTO bench_rows (job_id) VALUES (:id)")
#: Jobs per transaction in the handler-session rows: a batch of jobs that
#: write stays within PostgreSQL's 64 cached subtransactions.
WRITE_BATCH = 64


def _backend_cpu(pid: int | None) -> float | None:
    """The server backend's CPU seconds, when it runs on this machine."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Meter:
    """Wall clock, this process's CPU and a backend's CPU, summed over the
    spans spent inside `with meter:`."""

    def __init__(self, pid: int | None = None, jobs: int = 0) -> None:
        self.pid, self.jobs = pid, jobs
        self.wall = self.cpu = 0.0
        self.server: float | None = 0.0

    def __enter__(self) -> Meter:
        # The clocks are read last here and first on the way out, so the
        # backend's reading stays outside the timed span.
        server = _backend_cpu(self.pid)
        self._start = (time.perf_counter(), time.process_time(), server)
        return self

    def __exit__(self, *exc: object) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        server = _backend_cpu(self.pid)
        self.wall += wall - self._start[0]
        self.cpu += cpu - self._start[1]
        if self.server is not None and server is not None and self._start[2] is not None:
            self.server += server - self._start[2]
        else:
            self.server = None


#: A row's work for n jobs, returning what it measured.
Step = Callable[[int], Awaitable[Meter]]
Rows = list[tuple[str, str, Step]]


def timed(pid: int, body: Callable[[int], Awaitable[None]]) -> Step:
    async def step(n: int) -> Meter:
        with Meter(pid, n) as meter:
            await body(n)
        return meter
    return step


def per_job(pid: int, job: Callable[[], Awaitable[None]],
            begin: Callable[[], contextlib.AbstractAsyncContextManager[Any]] | None = None,
            batch: int = 0) -> Step:
    """`job()` n times, in transactions of `batch` jobs (0: all n) opened by
    `begin()`, or in none."""
    async def body(n: int) -> None:
        for start in range(0, n, batch or n):
            async with (begin or contextlib.nullcontext)():
                for _ in range(min(batch or n, n - start)):
                    await job()
    return timed(pid, body)


async def measure(name: str, what: str, step: Step, n: int, repeat: int,
                  prepare: Callable[[int], Awaitable[None]] | None = None) -> dict[str, Any]:
    """`step(n)` `repeat` times (after `prepare(n)`, not timed); medians per
    job, in microseconds."""
    wall, cpu, server = [], [], []
    for _ in range(repeat):
        if prepare is not None:
            await prepare(n)
        meter = await step(n)
        wall.append(meter.wall / meter.jobs * 1e6)
        cpu.append(meter.cpu / meter.jobs * 1e6)
        if meter.server is not None:
            server.append(meter.server / meter.jobs * 1e6)
    return {"name": name, "what": what, "n": n, "repeat": repeat,
            "wall_us": statistics.median(wall), "client_cpu_us": statistics.median(cpu),
            "server_cpu_us": statistics.median(server) if server else None,
            "jobs_per_sec": 1e6 / statistics.median(wall)}


def raw_steps(conn: asyncpg.Connection) -> Rows:
    async def select() -> None:
        await conn.fetchval("SELECT 1")

    async def insert() -> None:
        await conn.execute(INSERT, uuid.uuid4())

    async def released() -> None:
        async with conn.transaction():  # SAVEPOINT … RELEASE SAVEPOINT
            await insert()

    async def kept() -> None:
        await conn.execute(queries["job_savepoint"].sql)
        await insert()

    pid = conn.get_server_pid()
    return [
        ("round trip", "SELECT 1 in an open transaction", per_job(pid, select, conn.transaction)),
        ("INSERT", "one-row INSERT in an open transaction",
         per_job(pid, insert, conn.transaction)),
        ("SAVEPOINT + INSERT + RELEASE", "asyncpg's nested transaction around it",
         per_job(pid, released, conn.transaction)),
        ("SAVEPOINT + INSERT", "jobqueue's savepoint (simple query, never released), "
         f"{WRITE_BATCH} a transaction", per_job(pid, kept, conn.transaction, WRITE_BATCH)),
        ("INSERT + COMMIT", "a transaction per INSERT (durable commit)", per_job(pid, insert)),
    ]


async def sqlalchemy_steps(conn: AsyncConnection) -> Rows:
    """SQLAlchemy's own per-job savepoints, which jobqueue's lane session
    replaced, in driver transactions of WRITE_BATCH jobs as the old lane's
    (joined by a `conn.begin()` that sends no SQL on an autocommit connection)."""
    raw = await _driver(conn)
    reused = AsyncSession(bind=conn, join_transaction_mode="create_savepoint")

    @contextlib.asynccontextmanager
    async def begin() -> AsyncIterator[None]:
        async with raw.transaction(), conn.begin():
            yield

    async def session_per_job() -> None:
        async with AsyncSession(bind=conn, join_transaction_mode="create_savepoint") as s:
            await s.execute(INSERT_SA, {"id": uuid.uuid4()})
            await s.commit()  # RELEASE SAVEPOINT

    async def session_reused() -> None:
        await reused.execute(INSERT_SA, {"id": uuid.uuid4()})
        await reused.commit()

    pid = raw.get_server_pid()
    return [
        ("session per job (create_savepoint)", "SQLAlchemy's own savepoints: prepared, "
         "a fresh name each, released", per_job(pid, session_per_job, begin, WRITE_BATCH)),
        ("one session, create_savepoint", "the same session reused across jobs",
         per_job(pid, session_reused, begin, WRITE_BATCH)),
    ]


def lane_steps(url: str) -> Rows:
    """The handler's session as a worker gives it, through public names: a
    burst `JobRunner` with one lane drains n jobs whose handler times its
    own INSERT, so the row is the handler path alone, not the claims. A
    batch's first statement also sends the batch's deferred BEGIN: that job
    runs untimed, and the row is per timed job."""

    def drain(savepoints: str) -> Step:
        async def step(n: int) -> Meter:
            meter, driver = Meter(), None
            registry = HandlerRegistry()

            async def write(session: AsyncSession, payload: Any) -> None:
                nonlocal driver
                if driver is None:  # one lane: one connection for the whole run
                    driver = await _driver(await session.connection())
                    meter.pid = driver.get_server_pid()
                if not driver.is_in_transaction():  # it would begin the batch
                    await session.execute(INSERT_SA, {"id": uuid.uuid4()})
                    return
                with meter:
                    await session.execute(INSERT_SA, {"id": uuid.uuid4()})
                meter.jobs += 1

            registry.add("ceiling_write", write)
            report = await JobRunner(url, registry=registry, burst=True, concurrency=1,
                                     batch_size=WRITE_BATCH, savepoints=savepoints,
                                     install_signal_handlers=False).run()
            if report["processed"] != n or not meter.jobs:
                raise RuntimeError(f"the worker completed {report['processed']} of {n}, "
                                   f"{meter.jobs} of them timed")
            return meter
        return step

    return [("lane session, isolated", "jobqueue's, savepoints=\"always\": SAVEPOINT "
             "jobqueue_job before the first statement, never released", drain("always")),
            ("lane session, plain", "jobqueue's, savepoints=\"auto\", a job type that has "
             "not failed after writing: no savepoint", drain("auto"))]


def batch_steps(conn: asyncpg.Connection, batch: int) -> Rows:
    """No-op jobs through the queue's statements alone: the ceiling of a
    worker whose handlers cost nothing."""

    async def claim_then_complete(n: int) -> None:
        floor = (None, None)
        while (rows := split(await queries["claim"].fetch(
                conn, limit=batch, worker_id=1, queue="default", arm_types=["noop"],
                priorities=[0], floors=[floor[0]], floor_ids=[floor[1]]))[0]):
            floor = rows[-1]["floor"], rows[-1]["floor_id"]
            async with conn.transaction():
                await queries["complete"].fetch(conn, ids=[r["id"] for r in rows],
                                                results=[None] * len(rows), worker_id=1,
                                                taken=False)

    async def take_and_complete(n: int) -> None:
        floor = (None, None)
        while True:
            async with conn.transaction():
                rows, _ = split(await queries["take"].fetch(
                    conn, limit=batch, queue="default", arm_types=["noop"], priorities=[0],
                    floors=[floor[0]], floor_ids=[floor[1]]))
                if not rows:
                    return
                floor = rows[-1]["floor"], rows[-1]["floor_id"]
                await queries["complete"].fetch(conn, ids=[r["id"] for r in rows],
                                                results=[None] * len(rows), worker_id=1,
                                                taken=True)

    pid = conn.get_server_pid()
    return [
        (f"claim, then complete (batch {batch})", "two transactions: the claim commits "
         "`processing`, the completion commits the outcome", timed(pid, claim_then_complete)),
        (f"take and complete (batch {batch})", "one transaction: jobs locked, completed, "
         "committed", timed(pid, take_and_complete))]


def filler(conn: asyncpg.Connection, job_type: str) -> Callable[[int], Awaitable[None]]:
    """n jobs of `job_type`, before each timed run."""
    async def fill(n: int) -> None:
        await conn.execute(f"{scenarios.TRUNCATE_JOBS}, jobqueue_workers")
        await conn.execute("INSERT INTO jobs (job_type) SELECT $1 FROM generate_series(1, $2)",
                           job_type, n)
        await conn.execute("VACUUM ANALYZE jobs")
    return fill


async def _driver(conn: AsyncConnection) -> asyncpg.Connection:
    """The asyncpg connection under a SQLAlchemy one."""
    driver = (await conn.get_raw_connection()).driver_connection
    assert driver is not None
    return driver


async def run(n: int = 2000, repeat: int = 5, batch: int = 1000, noop_jobs: int = 20_000,
              name: str = "ceiling") -> list[dict[str, Any]]:
    """Every row, in a database of its own (`jobqueue_bench_<name>`, dropped
    at the end)."""
    url = await scenarios.open_bench(name)
    rows: list[dict[str, Any]] = []
    raw = await db.connect(url, application_name="jobqueue ceiling")
    plain = create_async_engine(url, isolation_level="AUTOCOMMIT")
    try:
        async with plain.connect() as conn:
            groups = [(raw_steps(raw), n, None), (await sqlalchemy_steps(conn), n, None),
                      (lane_steps(url), n, filler(raw, "ceiling_write")),
                      (batch_steps(raw, batch), noop_jobs, filler(raw, "noop"))]
            for steps, jobs, prepare in groups:
                rows += [await measure(label, what, step, jobs, repeat, prepare)
                         for label, what, step in steps]
    finally:
        await raw.close()
        await plain.dispose()
        await scenarios.close_bench(name)
    return rows
def table(rows: Sequence[dict[str, Any]]) -> str:
    lines = [f"{'':42} {'wall µs':>9} {'client CPU':>11} {'server CPU':>11} {'jobs/s':>9}"]
    for r in rows:
        server = "" if r["server_cpu_us"] is None else f"{r['server_cpu_us']:.1f}"
        lines.append(f"{r['name']:42} {r['wall_us']:9.1f} {r['client_cpu_us']:11.1f} "
                     f"{server:>11} {r['jobs_per_sec']:9,.0f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m jobqueue.benchmarks.ceiling",
        description="Per-job costs: raw statements, the handler's session, the queue's "
                    "statements (medians of several runs, one connection).")
    parser.add_argument("--jobs", type=int, default=2000, help="jobs per run (default 2000)")
    parser.add_argument("--repeat", type=int, default=5, help="runs per row (default 5)")
    parser.add_argument("--batch", type=int, default=1000,
                        help="batch size of the queue-statement rows (default 1000)")
    parser.add_argument("--noop-jobs", type=int, default=20_000,
                        help="jobs per run of the queue-statement rows (default 20000)")
    parser.add_argument("--loop", choices=LOOPS, default="auto",
                        help="event loop: uvloop when installed (auto, as the worker), or not")
    parser.add_argument("--save", action="store_true",
                        help="write the rows to the lab's results (ceiling.csv)")
    args = parser.parse_args(argv)
    if min(args.jobs, args.repeat, args.batch, args.noop_jobs) < 1:
        parser.error("every count must be at least 1")

    async def go() -> list[dict[str, Any]]:
        rows = await run(args.jobs, args.repeat, args.batch, args.noop_jobs)
        if args.save:
            url = embedded.database_url()
            save(rows, "ceiling", {**await scenarios.environment(url),
                                    "jobs": str(args.jobs), "repeat": str(args.repeat),
                                    "event_loop": type(asyncio.get_running_loop()).__module__})
        return rows

    with asyncio.Runner(loop_factory=loop_factory(args.loop)) as runner:
        sys.stdout.write(table(runner.run(go())) + "\n")


if __name__ == "__main__":
    main()
