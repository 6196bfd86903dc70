"""A limit is a promise kept by every worker at once: real worker processes,
several of them, each with lanes to spare, and the database's own timestamps
as the witness."""

from __future__ import annotations

import asyncio

import asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine

from jobqueue import enqueue_many, queues
from jobqueue.testing import wait_for

#: Most jobs of the queue running at once, from the database's timestamps: a
#: sweep over every job's [started_at, completed_at].
MOST_AT_ONCE = """
WITH edges AS (
    SELECT started_at AS at, 1 AS delta FROM jobs WHERE queue = $1
    UNION ALL
    SELECT completed_at, -1 FROM jobs WHERE queue = $1
)
SELECT max(running) FROM (
    SELECT sum(delta) OVER (ORDER BY at, delta) AS running FROM edges) AS s
"""


async def _registered(conn: asyncpg.Connection, n: int) -> None:
    """Every worker is up before the first job exists: a worker that started a
    few seconds late on a loaded machine would find the work already done."""
    await wait_for(lambda: conn.fetchval(
        "SELECT count(*) = $1 FROM jobqueue_workers WHERE state = 'shared'", n),
        timeout=30, message=f"{n} shared workers registered")


async def test_a_concurrency_limit_holds_across_shared_workers(
    engine: AsyncEngine, conn: asyncpg.Connection, spawn_worker
) -> None:
    async with engine.begin() as s:
        await queues.limit(s, "mail", concurrency=5)
    # Three workers with four lanes each: twelve lanes that would run twelve at once.
    workers = [spawn_worker("--shared", "--concurrency", "4") for _ in range(3)]
    await _registered(conn, 3)
    async with engine.begin() as s:
        await enqueue_many(s, "sleep", [{"seconds": 0.05}] * 300, queue="mail")
    samples: list[int] = []

    async def done() -> bool:
        samples.append(await conn.fetchval(
            "SELECT count(*) FROM jobs WHERE queue = 'mail' AND status = 'processing'"))
        return await conn.fetchval(
            "SELECT count(*) FROM jobs WHERE status = 'completed'") == 300

    await wait_for(done, timeout=90, interval=0.005, message="300 slow jobs completed")
    for w in workers:
        await w.stop()
    ran_on = await conn.fetchval("SELECT count(DISTINCT worker_id) FROM jobs")
    assert ran_on >= 2  # the work really was shared
    assert max(samples) == 5  # the limit was reached (there was something to hold)...
    assert await conn.fetchval(MOST_AT_ONCE, "mail") <= 5  # ...and never passed


async def test_a_rate_limit_holds_across_shared_workers(
    engine: AsyncEngine, conn: asyncpg.Connection, spawn_worker
) -> None:
    async with engine.begin() as s:
        await queues.limit(s, "api", rate="20/s")
    # Claims of two jobs at most: both workers' lanes keep asking every window.
    workers = [spawn_worker("--shared", "--batch-size", "2") for _ in range(2)]
    await _registered(conn, 2)
    async with engine.begin() as s:
        await enqueue_many(s, "noop", [{}] * 70, queue="api")
    await wait_for(lambda: conn.fetchval(
        "SELECT count(*) = 70 FROM jobs WHERE status = 'completed'"),
        timeout=60, message="70 jobs completed")
    for w in workers:
        await w.stop()
    per_second = [r["n"] for r in await conn.fetch(
        "SELECT date_trunc('second', started_at), count(*) AS n FROM jobs "
        "GROUP BY 1 ORDER BY 1")]
    assert sum(per_second) == 70 and len(per_second) >= 4  # 70 at 20/s: four windows at least
    assert max(per_second) == 20  # full windows, never more
    assert await conn.fetchval("SELECT count(DISTINCT worker_id) FROM jobs") == 2


async def test_pause_reaches_running_workers_and_resume_restarts_them(
    engine: AsyncEngine, conn: asyncpg.Connection, spawn_worker
) -> None:
    async with engine.begin() as s:
        await enqueue_many(s, "sleep", [{"seconds": 0.02}] * 400, queue="mail")
    workers = [spawn_worker("--shared") for _ in range(2)]
    await wait_for(lambda: conn.fetchval(
        "SELECT count(*) >= 20 FROM jobs WHERE status = 'completed'"),
        timeout=30, message="the workers are busy")
    async with engine.begin() as s:
        await queues.pause(s, "mail")
    paused_at = await conn.fetchval("SELECT now()")

    async def settled() -> int | None:  # nothing processing, and the count unchanged
        before = await conn.fetchval("SELECT count(*) FROM jobs WHERE status = 'completed'")
        await asyncio.sleep(0.3)
        after = await conn.fetchval("SELECT count(*) FROM jobs WHERE status = 'completed'")
        busy = await conn.fetchval("SELECT count(*) FROM jobs WHERE status = 'processing'")
        return after if after == before and not busy else None

    stopped_at = await wait_for(settled, timeout=10, message="the pause took effect")
    assert stopped_at < 400  # it stopped with work left
    assert await conn.fetchval(  # jobs started after the pause, if any, within a second
        "SELECT coalesce(max(started_at) - $1, interval '0') < interval '1 second' FROM jobs",
        paused_at)
    async with engine.begin() as s:
        await queues.resume(s, "mail")
    await wait_for(lambda: conn.fetchval(
        "SELECT count(*) = 400 FROM jobs WHERE status = 'completed'"),
        timeout=60, message="the rest completed after resume")
    for w in workers:
        await w.stop()
