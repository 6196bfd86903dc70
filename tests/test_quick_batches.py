"""Quick and claimed batches: which a lane picks, and what each looks like from outside.

A claimed batch commits `processing` before its handlers run; a quick batch
locks its jobs in its own transaction and moves them from `pending` straight
to their outcome. A handler can tell which it is in by reading its own job's
status through its session.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from jobqueue import HandlerRegistry, JobRunner, current_job, enqueue, enqueue_many
from jobqueue.schema.queries import queries
from jobqueue.testing import drain as drain_all
from jobqueue.testing import sql_trace, wait_for


async def drain(*args: Any, **options: Any) -> dict[str, Any]:
    """One lane: these tests read the batches a lane takes, one after another."""
    return await drain_all(*args, concurrency=1, **options)


def status_recorder(seen: list[str], sleep: float = 0.0) -> HandlerRegistry:
    registry = HandlerRegistry()

    @registry.register("look")
    async def look(session: AsyncSession, payload: dict[str, Any]) -> None:
        status = (await session.execute(text("SELECT status FROM jobs WHERE id = :id"),
                                        {"id": current_job().id})).scalar_one()
        seen.append(status)
        if sleep:
            await asyncio.sleep(sleep)

    return registry


async def enqueue_looks(engine: AsyncEngine, n: int) -> None:
    async with engine.begin() as s:
        await enqueue_many(s, "look", [{} for _ in range(n)])


async def test_a_lanes_first_job_is_claimed_then_quick_batches_follow(
    engine: AsyncEngine, db_url: str, conn: asyncpg.Connection
) -> None:
    seen: list[str] = []
    await enqueue_looks(engine, 6)
    with sql_trace() as trace:  # a second is ample for two jobs even on a loaded machine
        report = await drain(db_url, registry=status_recorder(seen), batch_size=2,
                             quick_batch=1.0)
    assert seen[0] == "processing"  # pace unknown: one job, claimed, to learn it
    assert seen[1:] == ["pending"] * 5  # fast jobs: taken and finished in one transaction
    # The first job claimed; 2 + 2 + 1 taken; the last take saw no other job
    # due, so the lane's next look is a claim of one (a lone job's way), which
    # finds nothing.
    assert trace.count("claim  (jobqueue/schema/queries.sql)") == 2
    assert trace.count("take  (jobqueue/schema/queries.sql)") == 3
    assert report["processed"] == 6 and report["batches"] == 4
    rows = await conn.fetch("SELECT status, started_at, completed_at, worker_id FROM jobs")
    assert {r["status"] for r in rows} == {"completed"}
    assert all(r["started_at"] <= r["completed_at"] for r in rows)
    assert {r["worker_id"] for r in rows} == {report["worker_id"]}


async def test_quick_batches_last_about_quick_batch(
    engine: AsyncEngine, db_url: str
) -> None:
    """10 ms jobs and quick_batch 0.5 s: batches of about 50, not the 1,000 allowed."""
    seen: list[str] = []
    await enqueue_looks(engine, 300)
    report = await drain(db_url, registry=status_recorder(seen, sleep=0.01), quick_batch=0.5)
    assert report["processed"] == 300
    # The first job alone, claimed; then batches of about 50 (a loaded machine's
    # slower jobs make them smaller, never larger).
    assert 300 / 50 <= report["batches"] - 1 <= 300 / 15
    assert seen.count("processing") == 1


async def test_quick_batch_zero_always_claims_first(
    engine: AsyncEngine, db_url: str
) -> None:
    seen: list[str] = []
    await enqueue_looks(engine, 6)
    with sql_trace() as trace:
        await drain(db_url, registry=status_recorder(seen), batch_size=2, quick_batch=0)
    assert seen == ["processing"] * 6
    assert "take  (jobqueue/schema/queries.sql)" not in trace


async def test_slow_jobs_are_claimed_one_at_a_time_and_show_processing(
    engine: AsyncEngine, db_url: str, conn: asyncpg.Connection
) -> None:
    """60 ms jobs, over the 50 ms default: each is claimed alone, just before it runs."""
    seen: list[str] = []
    await enqueue_looks(engine, 6)
    report = await drain(db_url, registry=status_recorder(seen, sleep=0.06), batch_size=10)
    assert seen == ["processing"] * 6
    assert report["batches"] == 6


@pytest.mark.parametrize("seconds", [-1, float("inf"), float("nan")])
async def test_quick_batch_must_be_finite_and_not_negative(db_url: str, seconds: float) -> None:
    with pytest.raises(ValueError, match="quick batch"):
        JobRunner(db_url, quick_batch=seconds)


async def test_slow_jobs_after_fast_ones_end_the_quick_batch_early(
    engine: AsyncEngine, db_url: str
) -> None:
    """The lane's first job is fast, so it takes the next ten in a quick batch;
    they take 0.6 s each: the batch stops after the first and the rest are
    claimed one at a time, shown `processing`. (A 0.15-s quick batch, not the
    50-ms default: a loaded machine can make the first, fast job slower than
    50 ms, and then there is no quick batch to stop. One slow job must lift
    the lane's running pace, 30 % the newest batch, past it: 0.3 × 0.6 s.)"""
    seen: list[str] = []
    registry = status_recorder(seen)
    registry.add("slow_look", status_recorder(seen, sleep=0.6).get("look"))  # type: ignore[arg-type]

    async with engine.begin() as s:
        await enqueue(s, "look", {})
    async with engine.begin() as s:
        await enqueue_many(s, "slow_look", [{} for _ in range(10)])
    report = await drain(db_url, registry=registry, quick_batch=0.15)
    assert report["processed"] == 11
    assert seen[:2] == ["processing", "pending"]  # claimed to learn; then a quick batch
    assert seen[2:] == ["processing"] * 9  # that batch stopped after one slow job


async def test_a_quick_batch_that_cannot_commit_is_rerun_job_by_job(
    engine: AsyncEngine, db_url: str, conn: asyncpg.Connection, child_registry: HandlerRegistry
) -> None:
    """test_worker's deferred-constraint case in a quick batch: the rollback
    released the jobs, so each is locked again (`retake`) to run alone."""
    registry = child_registry
    async with engine.begin() as s:  # the first batch (claimed) sets the lane's pace
        await enqueue_many(s, "child", [{"p": 1}] * 3)
    ids = []
    for p, retries in ((1, 3), (2, 0), (1, 3)):  # in order of run_at: the second batch
        async with engine.begin() as s:
            ids.append(await enqueue(s, "child", {"p": p}, max_retries=retries))
    with sql_trace() as trace:
        report = await drain(db_url, registry=registry, batch_size=3, quick_batch=60)
    assert trace.count("retake  (jobqueue/schema/queries.sql)") >= 3
    statuses = [await conn.fetchval("SELECT status FROM jobs WHERE id = $1", i) for i in ids]
    assert statuses == ["completed", "failed", "completed"]
    error = await conn.fetchval("SELECT error_message FROM jobs WHERE id = $1", ids[1])
    assert "ForeignKeyViolation" in error
    assert await conn.fetchval("SELECT count(*) FROM children") == 5
    assert report["processed"] == 5 and report["failed"] == 1


async def test_a_job_that_arrives_alone_is_claimed_and_begins_no_transaction_it_does_not_need(
    engine: AsyncEngine, db_url: str, conn: asyncpg.Connection
) -> None:
    """An idle lane gets one job at a time: a claim (committed without waiting
    for the disk), then, for a job that sends nothing, its `complete_claimed` alone in
    autocommit; a job that writes begins the transaction at its first statement."""
    await conn.execute("CREATE TABLE lone_writes (job_id uuid)")
    registry = HandlerRegistry()

    @registry.register("nothing")
    async def nothing(session: AsyncSession, payload: dict[str, Any]) -> None:
        pass

    @registry.register("write")
    async def write(session: AsyncSession, payload: dict[str, Any]) -> None:
        await session.execute(text("INSERT INTO lone_writes VALUES (:id)"),
                              {"id": current_job().id})

    async def one(job_type: str) -> list[str]:
        """What the lane sent for one job enqueued while it was idle."""
        await wait_for(lambda: runner.bell.waiting == 1, message="an idle lane")
        start = len(trace)
        async with engine.begin() as s:
            job_id = await enqueue(s, job_type, {})
        await wait_for(lambda: conn.fetchval(
            "SELECT status = 'completed' FROM jobs WHERE id = $1", job_id), message="the job")
        # The lane looks for more work after the job's outcome, then waits
        # again: read the trace only then (read as soon as the job showed
        # completed, a loaded machine's lane had not sent that look yet).
        await wait_for(lambda: runner.bell.waiting == 1, message="the lane idle again")
        # From the enqueue's COMMIT (the lane can see the job only from then
        # on) to the job's outcome; the lane's look for more work follows.
        sent = trace[start:]
        sent = sent[sent.index("COMMIT") + 1:]
        return sent[:sent.index("complete_claimed  (jobqueue/schema/queries.sql)") + 2]

    runner = JobRunner(db_url, registry=registry, concurrency=1, poll_interval=60.0)
    with sql_trace() as trace:
        task = asyncio.create_task(runner.run())
        try:
            await asyncio.wait_for(runner.wait_active(), 10)
            first = await one("nothing")  # a lane's first job: claimed anyway
            assert await one("nothing") == first == [
                "claim  (jobqueue/schema/queries.sql)",
                "complete_claimed  (jobqueue/schema/queries.sql)",
                "claim  (jobqueue/schema/queries.sql)"]  # the look for more: nothing
            assert await one("write") == [
                "claim  (jobqueue/schema/queries.sql)", "BEGIN",
                "INSERT INTO lone_writes VALUES ($1)",
                "complete_claimed  (jobqueue/schema/queries.sql)", "COMMIT"]
        finally:
            runner.stop()
            await asyncio.wait_for(task, 30)
    assert await conn.fetchval("SELECT count(*) FROM lone_writes") == 1
    # The claim turns synchronous_commit off for its own transaction only.
    async with conn.transaction():
        await conn.fetch(queries["claim"].positional, *queries["claim"].args(
            {"limit": 1, "worker_id": 1, "queue": "default", "arm_types": ["nothing"],
             "priorities": [0], "floors": [None], "floor_ids": [None]}))
        assert await conn.fetchval("SHOW synchronous_commit") == "off"
    assert await conn.fetchval("SHOW synchronous_commit") == "on"
