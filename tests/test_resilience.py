"""Crashes, hangs, restarts and dropped connections, with real processes.

Every test ends by checking the same invariants: every job completed, none
left `processing`, and each job's database effect (a row written through the
handler's session) committed exactly once, even where a job ran twice. The
recovery times the tests observe are recorded as test properties; they are
measured properly, over repeated trials, by the recovery notebook (`jobqueue.benchmarks.recovery`).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from datetime import datetime

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from jobqueue import db, embedded, enqueue_many
from jobqueue.testing import WorkerProcess, in_state, wait_for, worker_state
from jobqueue.worker import DEFAULT_CONCURRENCY

TIMEOUT = 60


async def started_jobs(conn: asyncpg.Connection) -> int:
    return await conn.fetchval("SELECT count(*) FROM events WHERE kind = 'started'")


async def completed(conn: asyncpg.Connection) -> int:
    return await conn.fetchval("SELECT count(*) FROM jobs WHERE status = 'completed'")


async def assert_nothing_lost_nothing_doubled(conn: asyncpg.Connection, n: int) -> None:
    statuses = {r["status"]: r["n"] for r in await conn.fetch(
        "SELECT status, count(*) AS n FROM jobs GROUP BY status")}
    assert statuses == {"completed": n}
    assert await conn.fetchval(
        "SELECT count(*) FROM (SELECT job_id FROM effects GROUP BY job_id "
        "HAVING count(*) <> 1) AS d") == 0, "a job's effect committed twice"
    assert await conn.fetchval(
        "SELECT count(*) FROM jobs AS j WHERE NOT EXISTS "
        "(SELECT 1 FROM effects AS e WHERE e.job_id = j.id)") == 0, "a job without its effect"


async def rerun_jobs(conn: asyncpg.Connection) -> int:
    """Jobs that started more than once (the proof that a crash hit mid-batch)."""
    return await conn.fetchval(
        "SELECT count(*) FROM (SELECT job_id FROM events WHERE kind = 'started' "
        "GROUP BY job_id HAVING count(*) > 1) AS d")


async def first_completion_after(conn: asyncpg.Connection, t0: datetime,
                                 worker_id: int) -> datetime:
    return await conn.fetchval(
        "SELECT min(completed_at) FROM jobs WHERE completed_at > $1 AND worker_id = $2",
        t0, worker_id)


async def put_to_work(engine: AsyncEngine, conn: asyncpg.Connection, n: int, *,
                      sleep: float, started: int) -> None:
    """Enqueue n `effect` jobs and wait until the workers have started some."""
    async with engine.begin() as s:
        await enqueue_many(s, "effect", [{"sleep": sleep} for _ in range(n)])
    await wait_for(lambda: _at_least(started_jobs(conn), started), timeout=TIMEOUT,
                   message="work under way")


async def signal_and_recover(conn: asyncpg.Connection, target: WorkerProcess,
                             standby: WorkerProcess, sig: signal.Signals, n: int
                             ) -> tuple[datetime, asyncpg.Record, float]:
    """Signal the active worker, wait until all n jobs completed; return the
    signal time, the standby's registration and its recovery in seconds."""
    target.signal(sig)
    t0 = await conn.fetchval("SELECT clock_timestamp()")
    await wait_for(lambda: _at_least(completed(conn), n), timeout=TIMEOUT,
                   message=f"every job completed after {sig.name}")
    new_active = await worker_state(conn, standby)
    assert new_active is not None
    recovery = (await first_completion_after(conn, t0, new_active["id"]) - t0).total_seconds()
    return t0, new_active, recovery


async def active_and_standby(conn, spawn_worker: Callable[..., WorkerProcess], *args: str
                             ) -> tuple[WorkerProcess, WorkerProcess]:
    first = spawn_worker(*args)
    await wait_for(lambda: in_state(conn, first, "active"), timeout=TIMEOUT,
                   message="the first worker to be active")
    second = spawn_worker(*args)
    await wait_for(lambda: in_state(conn, second, "standby"), timeout=TIMEOUT,
                   message="the second worker to stand by")
    return first, second


@pytest.mark.parametrize("mode", ["claimed", "quick"])
async def test_sigkill_of_the_active_worker_mid_batch(
    engine: AsyncEngine, spawn_worker, conn: asyncpg.Connection, record_property, mode: str
) -> None:
    """Claimed batches (50 ms jobs, 10 a batch: over the default quick_batch)
    are rescued; quick ones (`--quick-batch 5`, from the second batch on)
    simply roll back."""
    args = ["--batch-size", "10"] + (["--quick-batch", "5"] if mode == "quick" else [])
    active, standby = await active_and_standby(conn, spawn_worker, *args)
    await put_to_work(engine, conn, 60, sleep=0.05, started=15 if mode == "quick" else 5)
    if mode == "quick":  # the batch under way holds its jobs without marking them
        assert await conn.fetchval("SELECT count(*) FROM jobs WHERE status = 'processing'") == 0

    t0, new_active, recovery = await signal_and_recover(conn, active, standby,
                                                        signal.SIGKILL, 60)
    assert new_active["state"] == "active"
    record_property("recovery_after_sigkill_seconds", recovery)
    await assert_nothing_lost_nothing_doubled(conn, 60)
    assert await rerun_jobs(conn) >= 1  # the crash hit a running job; it ran again, once in effect
    assert await conn.fetchval(
        "SELECT count(*) FROM jobs WHERE completed_at > $1 AND worker_id <> $2",
        t0, new_active["id"]) == 0


async def test_sigstop_hang_is_fenced_and_the_sleeper_cannot_finish_anything(
    engine: AsyncEngine, spawn_worker, conn: asyncpg.Connection, record_property
) -> None:
    args = ("--batch-size", "10", "--lease", "1.5")
    hung, standby = await active_and_standby(conn, spawn_worker, *args)
    hung_id = (await worker_state(conn, hung))["id"]
    await put_to_work(engine, conn, 40, sleep=0.1, started=3)

    t0, new_active, recovery = await signal_and_recover(conn, hung, standby,
                                                        signal.SIGSTOP, 40)
    record_property("recovery_after_sigstop_seconds", recovery)
    # Not before the lease ran out, counted from the frozen worker's last
    # heartbeat (at most one heartbeat interval, 0.375 s here, before the stop).
    assert recovery >= 1.5 - 0.375
    assert "fenced off worker" in standby.log()

    # Wake the sleeper: it must notice it was cut off, finish nothing, and stand by.
    hung.signal(signal.SIGCONT)
    await wait_for(lambda: in_state(conn, hung, "standby"), timeout=TIMEOUT,
                   message="the woken worker to rejoin as a standby")
    await assert_nothing_lost_nothing_doubled(conn, 40)
    assert await conn.fetchval(
        "SELECT count(*) FROM jobs WHERE completed_at > $1 AND worker_id = $2", t0, hung_id) == 0
    for w in (hung, standby):
        w.signal(signal.SIGTERM)
    assert await hung.wait(TIMEOUT) == 0 and await standby.wait(TIMEOUT) == 0


@pytest.mark.skipif(bool(os.environ.get("DATABASE_URL")),
                    reason="restarts the embedded server")
@pytest.mark.serial  # every other test's connections would go with the restart
async def test_database_restart_under_a_working_worker(
    engine: AsyncEngine, spawn_worker, db_url: str, conn: asyncpg.Connection
) -> None:
    worker = spawn_worker("--batch-size", "5")
    await wait_for(lambda: in_state(conn, worker, "active"), timeout=TIMEOUT, message="active")
    await put_to_work(engine, conn, 40, sleep=0.05, started=3)

    await _to_thread(embedded.EmbeddedPostgres().restart)

    fresh = await asyncpg.connect(**db.asyncpg_connect_args(db_url))
    try:
        await wait_for(lambda: _at_least(completed(fresh), 40), timeout=TIMEOUT,
                       message="every job completed after the restart")
        await assert_nothing_lost_nothing_doubled(fresh, 40)
        assert worker.proc.poll() is None, "the worker must survive a restart"
        assert "starting over" in worker.log()
    finally:
        await fresh.close()


async def test_dropped_lane_and_control_connections(
    engine: AsyncEngine, spawn_worker, conn: asyncpg.Connection
) -> None:
    worker = spawn_worker("--batch-size", "5")
    await wait_for(lambda: in_state(conn, worker, "active"), timeout=TIMEOUT, message="active")
    await put_to_work(engine, conn, 40, sleep=0.05, started=3)

    lanes = await conn.fetchval(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE application_name LIKE 'jobqueue worker % lane %' "
        "AND datname = current_database()")
    assert lanes == DEFAULT_CONCURRENCY  # each lane has a connection of its own
    await wait_for(lambda: _at_least(started_jobs(conn), 12), timeout=TIMEOUT,
                   message="work to go on after losing the lanes")
    controls = await conn.fetchval(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE application_name LIKE 'jobqueue worker % active %' "
        "AND datname = current_database()")
    assert controls == 1
    await wait_for(lambda: _at_least(completed(conn), 40), timeout=TIMEOUT,
                   message="every job completed after the dropped connections")
    await assert_nothing_lost_nothing_doubled(conn, 40)
    assert worker.proc.poll() is None
    assert worker.log().count("starting over") >= 2  # the lane's loss, then the control's


async def two_shared_workers_at_work(
    engine: AsyncEngine, spawn_worker, conn: asyncpg.Connection, n: int, sleep: float,
    *args: str,
) -> tuple[WorkerProcess, WorkerProcess]:
    """Two --shared workers, n jobs enqueued, both seen running jobs."""
    a, b = (spawn_worker("--shared", "--batch-size", "5", *args) for _ in range(2))
    for w in (a, b):
        await wait_for(lambda w=w: in_state(conn, w, "shared"), timeout=TIMEOUT, message="shared")
    async with engine.begin() as s:
        await enqueue_many(s, "effect", [{"sleep": sleep} for _ in range(n)])
    await wait_for(
        lambda: conn.fetchval("SELECT count(DISTINCT worker_pid) = 2 FROM events"),
        timeout=TIMEOUT, message="both workers working at once")
    return a, b


async def test_shared_mode_workers_share_and_survive_a_crash(
    engine: AsyncEngine, spawn_worker, conn: asyncpg.Connection
) -> None:
    a, b = await two_shared_workers_at_work(engine, spawn_worker, conn, 150, 0.02)
    a.signal(signal.SIGKILL)
    await wait_for(lambda: _at_least(completed(conn), 150), timeout=TIMEOUT,
                   message="every job completed after one shared worker died")
    await assert_nothing_lost_nothing_doubled(conn, 150)
    await wait_for(lambda: conn.fetchval("SELECT count(*) = 1 FROM jobqueue_workers"),
                   timeout=TIMEOUT, message="the dead worker to be forgotten")
    b.signal(signal.SIGTERM)
    assert await b.wait(TIMEOUT) == 0


async def test_shared_mode_fences_a_hung_worker(
    engine: AsyncEngine, spawn_worker, conn: asyncpg.Connection
) -> None:
    a, b = await two_shared_workers_at_work(engine, spawn_worker, conn, 60, 0.05,
                                            "--lease", "1.5")
    a.signal(signal.SIGSTOP)
    await wait_for(lambda: _at_least(completed(conn), 60), timeout=TIMEOUT,
                   message="every job completed while one shared worker is stopped")
    assert "fenced off worker" in b.log()
    a.signal(signal.SIGCONT)
    await wait_for(lambda: in_state(conn, a, "shared"), timeout=TIMEOUT,
                   message="the woken worker to rejoin")
    await assert_nothing_lost_nothing_doubled(conn, 60)
    for w in (a, b):
        w.signal(signal.SIGTERM)
    assert await a.wait(TIMEOUT) == 0 and await b.wait(TIMEOUT) == 0


async def _at_least(value: object, n: int) -> bool:
    return await value >= n  # type: ignore[operator]


async def _to_thread(func: Callable[[], object]) -> object:
    import asyncio

    return await asyncio.to_thread(func)
