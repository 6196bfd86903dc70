"""Where a job's time goes: `python -m jobqueue.benchmarks.ceiling`.

The README's "where the time went" as a command anyone can rerun. Each row
does one thing N times on one connection, against a database of its own, and
reports the time per job (wall clock, this process's CPU, and the server
backend's CPU when the server runs on this machine), the median of R runs:

- the raw costs a job can pay: a round trip, a one-row INSERT inside an open
  transaction, the same with a savepoint around it (released, or never
  released as jobqueue's are), and an INSERT committed on its own (what a
  queue whose handlers write through their own pool pays per job);
- the handler's session, the same INSERT through SQLAlchemy: a session per
  job joining the batch with `join_transaction_mode="create_savepoint"`
  (what jobqueue did before: SQLAlchemy's savepoints are prepared statements
  with fresh names), one such session reused across jobs, and jobqueue's lane
  session (`worker/handler.py`), isolated (its own savepoint) and plain (none);
- the queue's own statements for a batch of no-op jobs, without a worker:
  claim then complete (two transactions, two row versions per job) against
  take and complete in one (`queries.sql`: claim, take, complete).

Figures vary from run to run on a shared machine; compare rows of one run.
`--save` writes them to the lab's results (`ceiling.csv`) with the machine's
description, for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, create_async_engine

from jobqueue import db, embedded
from jobqueue.benchmarks import save, scenarios
from jobqueue.eventloop import LOOPS, loop_factory
from jobqueue.schema.queries import queries
from jobqueue.worker.handler import lane_engine, state_of

INSERT = "INSERT INTO bench_rows (job_id) VALUES ($1)"
INSERT_SA = text("INSERT INTO bench_rows (job_id) VALUES (:id)")
#: Jobs per transaction in the handler-session rows: a batch of jobs that
#: write stays within PostgreSQL's 64 cached subtransactions.
WRITE_BATCH = 64

Step = Callable[[int], Awaitable[None]]


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _backend_cpu(pid: int) -> float | None:
    """The server backend's CPU seconds, when it runs on this machine."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(name: str, step: Step, n: int, repeat: int, backend_pid: int,
                  what: str, prepare: Step | None = None) -> dict[str, Any]:
    """Run `step(n)` `repeat` times (after `prepare(n)`, not timed); medians
    per job, in microseconds."""
    wall, cpu, server = [], [], []
    for _ in range(repeat):
        if prepare is not None:
            await prepare(n)
        before = (time.perf_counter(), _cpu(), _backend_cpu(backend_pid))
        await step(n)
        after = (time.perf_counter(), _cpu(), _backend_cpu(backend_pid))
        wall.append((after[0] - before[0]) / n * 1e6)
        cpu.append((after[1] - before[1]) / n * 1e6)
        if before[2] is not None and after[2] is not None:
            server.append((after[2] - before[2]) / n * 1e6)
    return {"name": name, "what": what, "n": n, "repeat": repeat,
            "wall_us": statistics.median(wall), "client_cpu_us": statistics.median(cpu),
            "server_cpu_us": statistics.median(server) if server else None,
            "jobs_per_sec": 1e6 / statistics.median(wall)}


# -- raw statements on asyncpg ----------------------------------------------------


def raw_steps(conn: asyncpg.Connection) -> list[tuple[str, str, Step]]:
    async def round_trip(n: int) -> None:
        async with conn.transaction():
            for _ in range(n):
                await conn.fetchval("SELECT 1")

    async def insert(n: int) -> None:
        async with conn.transaction():
            for _ in range(n):
                await conn.execute(INSERT, uuid.uuid4())

    async def savepoint_released(n: int) -> None:
        async with conn.transaction():
            for _ in range(n):
                async with conn.transaction():  # SAVEPOINT … RELEASE SAVEPOINT
                    await conn.execute(INSERT, uuid.uuid4())

    async def savepoint_kept(n: int) -> None:
        for start in range(0, n, WRITE_BATCH):
            async with conn.transaction():
                for _ in range(min(WRITE_BATCH, n - start)):
                    await conn.execute(queries["job_savepoint"].sql)
                    await conn.execute(INSERT, uuid.uuid4())

    async def commit_each(n: int) -> None:
        for _ in range(n):
            await conn.execute(INSERT, uuid.uuid4())

    return [
        ("round trip", "SELECT 1 in an open transaction", round_trip),
        ("INSERT", "one-row INSERT in an open transaction", insert),
        ("SAVEPOINT + INSERT + RELEASE", "asyncpg's nested transaction around it",
         savepoint_released),
        ("SAVEPOINT + INSERT", "jobqueue's savepoint (simple query, never released), "
         f"{WRITE_BATCH} a transaction", savepoint_kept),
        ("INSERT + COMMIT", "a transaction per INSERT (durable commit)", commit_each),
    ]


# -- the handler's session ----------------------------------------------------------


def sqlalchemy_steps(conn: AsyncConnection) -> list[tuple[str, str, Step]]:
    """The INSERT as a handler writes it, `session.execute(text(...))`, in
    batches of WRITE_BATCH jobs: one driver transaction each, which the
    sessions join as the old lane's did (a `conn.begin()` that sends no SQL
    on an autocommit connection)."""

    async def batches(n: int, job: Callable[[], Awaitable[None]]) -> None:
        raw = await _driver(conn)
        for start in range(0, n, WRITE_BATCH):
            tx = raw.transaction()
            await tx.start()
            async with conn.begin():
                for _ in range(min(WRITE_BATCH, n - start)):
                    await job()
            await tx.commit()

    async def session_per_job(n: int) -> None:
        async def job() -> None:
            async with AsyncSession(bind=conn, join_transaction_mode="create_savepoint") as s:
                await s.execute(INSERT_SA, {"id": uuid.uuid4()})
                await s.commit()  # RELEASE SAVEPOINT

        await batches(n, job)

    async def session_reused(n: int) -> None:
        session = AsyncSession(bind=conn, join_transaction_mode="create_savepoint")

        async def job() -> None:
            await session.execute(INSERT_SA, {"id": uuid.uuid4()})
            await session.commit()

        await batches(n, job)
        await session.close()

    return [
        ("session per job (create_savepoint)", "SQLAlchemy's own savepoints: prepared, "
         "a fresh name each, released", session_per_job),
        ("one session, create_savepoint", "the same session reused across jobs",
         session_reused),
    ]


def lane_steps(conn: AsyncConnection, raw: asyncpg.Connection) -> list[tuple[str, str, Step]]:
    """jobqueue's lane session: one session for the lane's life; the engine's
    hooks open each isolated job's savepoint before its first statement."""
    session = AsyncSession(bind=conn, expire_on_commit=False)
    state = state_of(conn.info)

    def batches(isolated: bool) -> Step:
        async def step(n: int) -> None:
            for start in range(0, n, WRITE_BATCH):
                tx = raw.transaction()
                await tx.start()
                state.start_transaction()
                for _ in range(min(WRITE_BATCH, n - start)):
                    state.start_job(isolated)
                    await session.execute(INSERT_SA, {"id": uuid.uuid4()})
                    state.end_job()
                await tx.commit()
        return step

    return [("lane session, isolated", "jobqueue's: SAVEPOINT jobqueue_job before the "
             "first statement, never released", batches(True)),
            ("lane session, plain", "jobqueue's, for a job type that has not failed "
             "after writing: no savepoint", batches(False))]


# -- the queue's own statements -----------------------------------------------------


def batch_steps(conn: asyncpg.Connection, batch: int
                ) -> tuple[Step, list[tuple[str, str, Step]]]:
    """No-op jobs through the queue's statements alone: the ceiling of a
    worker whose handlers cost nothing. Returns the step that fills the table
    (run before each timed run) and the rows."""

    async def fill(n: int) -> None:
        await conn.execute("TRUNCATE jobs")
        await conn.execute("INSERT INTO jobs (job_type) SELECT 'noop' FROM generate_series(1, $1)",
                           n)
        await conn.execute("VACUUM ANALYZE jobs")

    async def claim_then_complete(n: int) -> None:
        floor = (None, None)
        while rows := await queries["claim"].fetch(conn, limit=batch, worker_id=1,
                                                      queue="default", job_types=["noop"],
                                                      priorities=[0], floors=[floor[0]],
                                                      floor_ids=[floor[1]]):
            floor = rows[-1]["floor"], rows[-1]["floor_id"]
            async with conn.transaction():
                await queries["complete"].fetch(conn, ids=[r["id"] for r in rows],
                                                results=[None] * len(rows), worker_id=1,
                                                taken=False)

    async def take_and_complete(n: int) -> None:
        floor = (None, None)
        while True:
            async with conn.transaction():
                rows = await queries["take"].fetch(conn, limit=batch, queue="default",
                                                     job_types=["noop"], priorities=[0],
                                                     floors=[floor[0]], floor_ids=[floor[1]])
                if not rows:
                    return
                floor = rows[-1]["floor"], rows[-1]["floor_id"]
                await queries["complete"].fetch(conn, ids=[r["id"] for r in rows],
                                                results=[None] * len(rows), worker_id=1,
                                                taken=True)

    return fill, [
        (f"claim, then complete (batch {batch})", "two transactions: the claim commits "
         "`processing`, the completion commits the outcome", claim_then_complete),
        (f"take and complete (batch {batch})", "one transaction: jobs locked, completed, "
         "committed", take_and_complete)]


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
    lanes = lane_engine(url, 1, "jobqueue ceiling lane")
    try:
        pid = raw.get_server_pid()
        for label, what, step in raw_steps(raw):
            rows.append(await measure(label, step, n, repeat, pid, what))
        async with plain.connect() as conn:
            pid = (await _driver(conn)).get_server_pid()
            for label, what, step in sqlalchemy_steps(conn):
                rows.append(await measure(label, step, n, repeat, pid, what))
        async with lanes.connect() as conn:
            driver = await _driver(conn)
            for label, what, step in lane_steps(conn, driver):
                rows.append(await measure(label, step, n, repeat, driver.get_server_pid(),
                                          what))
        fill, steps = batch_steps(raw, batch)
        for label, what, step in steps:
            rows.append(await measure(label, step, noop_jobs, repeat, raw.get_server_pid(),
                                      what, prepare=fill))
    finally:
        await raw.close()
        await plain.dispose()
        await lanes.dispose()
        await scenarios.close_bench(name)
    return rows


def table(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a plain-text table."""
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
