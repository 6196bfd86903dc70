"""A job that kills every worker that runs it ends, and blames nobody else.

Real worker processes under a supervisor that restarts them whenever they
die, as systemd or Kubernetes would. The poison pill sits among innocent
jobs that write effects, so it dies inside quick batches beside them first.
"""

from __future__ import annotations

import json

import asyncpg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from jobqueue import enqueue, enqueue_many
from jobqueue.testing import in_state, wait_for

WORKER_FLAGS = ("--shared", "--backoff-base", "0.2", "--backoff-jitter", "0")


async def test_a_poison_pill_fails_after_its_retries_and_its_batch_mates_run_once(
        engine: AsyncEngine, conn: asyncpg.Connection, spawn_worker) -> None:
    async with engine.begin() as s:
        innocents = await enqueue_many(s, "effect", [{}] * 40)
        poison = await enqueue(s, "poison", {}, max_retries=2)
        innocents += await enqueue_many(s, "effect", [{}] * 40)
    workers = [spawn_worker(*WORKER_FLAGS) for _ in range(2)]
    deaths = 0

    async def settled() -> bool:
        """The supervisor's round: restart the dead; done when every job ended."""
        nonlocal deaths
        for n, worker in enumerate(workers):
            if worker.proc.poll() is not None:
                deaths += 1
                worker.close()
                workers[n] = spawn_worker(*WORKER_FLAGS)
        return await conn.fetchval(
            "SELECT count(*) = 81 FROM jobs WHERE status IN ('completed', 'failed')")

    await wait_for(settled, timeout=120, interval=0.1, message="every job ended")
    for worker in workers:
        deaths += (await worker.wait(5) if worker.proc.poll() is not None else 0) != 0
        await worker.stop()

    row = await conn.fetchrow("SELECT * FROM jobs WHERE id = $1", poison)
    history = json.loads(row["error_history"])
    ran = await conn.fetchval("SELECT count(*) FROM events WHERE job_id = $1", poison)
    assert deaths == ran >= 3  # every run of it took a worker down, and there were three at least
    assert row["status"] == "failed" and row["retry_count"] == 2
    assert len(history) == 3  # counted only when it ran alone: its retries, plus the first
    assert all(e["error"].startswith("its worker (id ") and e["worker_id"] for e in history)
    assert row["error_message"] == history[-1]["error"]

    jobs = await conn.fetch("SELECT * FROM jobs WHERE id = ANY($1)", innocents)
    assert {(j["status"], j["retry_count"], j["error_history"]) for j in jobs} == {
        ("completed", 0, "[]")}  # no innocent lost an attempt
    assert sum(j["run_alone"] for j in jobs) > 0  # some were in its batches when it struck
    effects = dict(await conn.fetch("SELECT job_id, count(*) FROM effects GROUP BY job_id"))
    assert effects == {job_id: 1 for job_id in innocents}  # exactly once; none of the poison's


async def test_a_handler_that_blocks_the_event_loop_gets_its_worker_fenced_and_counted(
        engine: AsyncEngine, conn: asyncpg.Connection, spawn_worker) -> None:
    async with engine.begin() as s:
        job_id = await enqueue(s, "block", {"seconds": 4}, max_retries=0)
        await s.execute(text("UPDATE jobs SET timeout = 1"))
    # Its own timeout cannot fire while the loop is blocked; another worker's lease can.
    # That one is up before the block begins (its start-up must not eat the 4 s on a
    # busy machine) and knows no `block`, so the job goes to the other.
    fencer = spawn_worker("--shared", "--lease", "1", handlers="tests.handlers_left")
    await wait_for(lambda: in_state(conn, fencer, "shared"), timeout=30, message="the fencer")
    blocked = spawn_worker("--shared", "--lease", "1")
    await wait_for(lambda: conn.fetchval("SELECT count(*) = 1 FROM events WHERE job_id = $1",
                                         job_id), timeout=30, message="the handler started")
    blocked_id = await conn.fetchval("SELECT worker_id FROM jobs WHERE id = $1", job_id)
    await wait_for(lambda: conn.fetchval("SELECT status = 'failed' FROM jobs WHERE id = $1",
                                         job_id), timeout=30, message="the job failed")
    row = await conn.fetchrow("SELECT * FROM jobs WHERE id = $1", job_id)
    assert row["error_message"] == f"its worker (id {blocked_id}) died while running it"
    assert "fenced off worker" in fencer.log()
    assert await conn.fetchval("SELECT count(*) FROM effects") == 0  # its write rolled back
    await wait_for(lambda: "starting over" in blocked.log(), timeout=30,
                   message="the blocked worker, awake, to start over")
    for worker in (blocked, fencer):
        await worker.stop()
