"""Routing across real worker processes (#18): each `--shared` worker takes only
the job types it has handlers for, and the jobs nobody takes are reported by
`jobqueue status --json` and `/metrics` instead of waiting in silence."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from jobqueue import enqueue_many
from jobqueue.testing import WorkerProcess, in_state, wait_for, worker_state
from tests.conftest import run_cli
from tests.test_metrics import scrape

TIMEOUT = 30


async def working_id(conn: asyncpg.Connection, worker: WorkerProcess) -> int:
    """The worker's id once it is at work (shared state, heartbeat in)."""
    await wait_for(lambda: in_state(conn, worker, "shared"), timeout=TIMEOUT,
                   message=f"worker {worker.pid} at work")
    row = await worker_state(conn, worker)
    assert row is not None
    return int(row["id"])


async def done(conn: asyncpg.Connection, job_type: str, n: int) -> bool:
    return await conn.fetchval("SELECT count(*) FROM jobs WHERE job_type = $1 "
                               "AND status = 'completed'", job_type) == n


async def ran_by(conn: asyncpg.Connection, job_type: str) -> set[tuple[int, str, int]]:
    """(jobs.worker_id, the handler module's name, its process id) of a type's jobs."""
    rows = await conn.fetch("SELECT j.worker_id, e.kind, e.worker_pid FROM jobs AS j "
                            "JOIN events AS e ON e.job_id = j.id WHERE j.job_type = $1",
                            job_type)
    return {(r["worker_id"], r["kind"], r["worker_pid"]) for r in rows}


def unserved_in_status(db_url: str) -> dict[tuple[str, str], int]:
    result = run_cli("status", "--json", url=db_url)
    assert result.returncode == 0, result.stderr
    return {(u["queue"], u["job_type"]): u["count"]
            for u in json.loads(result.stdout)["unserved"]}


async def unserved_in_metrics(client: httpx.AsyncClient) -> dict[tuple[str, str], float]:
    return {(dict(labels)["queue"], dict(labels)["job_type"]): v
            for (name, labels), v in (await scrape(client)).items()
            if name == "jobqueue_unserved_jobs"}


async def test_workers_with_disjoint_handlers_share_a_mixed_queue_and_report_the_rest(
    spawn_worker: Any, engine: AsyncEngine, conn: asyncpg.Connection, db_url: str,
    client: httpx.AsyncClient
) -> None:
    left = spawn_worker("--shared", handlers="tests.handlers_left")
    right = spawn_worker("--shared", handlers="tests.handlers_right")
    left_id, right_id = await working_id(conn, left), await working_id(conn, right)
    async with engine.begin() as s:  # interleaved types, in two queues
        for queue in ("default", "mail"):
            for _ in range(10):
                await enqueue_many(s, "alpha", [{}], queue=queue)
                await enqueue_many(s, "beta", [{}], queue=queue)
        await enqueue_many(s, "gamma", [{}, {}, {}])  # nobody handles it

    await wait_for(lambda: done(conn, "alpha", 20), timeout=TIMEOUT, message="alpha done")
    await wait_for(lambda: done(conn, "beta", 20), timeout=TIMEOUT, message="beta done")
    # Every job was run by the worker that has its handler, and by no other.
    assert await ran_by(conn, "alpha") == {(left_id, "left", left.pid)}
    assert await ran_by(conn, "beta") == {(right_id, "right", right.pid)}
    assert await conn.fetchval("SELECT count(*) FROM events") == 40  # each ran once

    assert await conn.fetchval("SELECT count(*) FROM jobs WHERE job_type = 'gamma' "
                               "AND status = 'pending' AND retry_count = 0") == 3
    assert unserved_in_status(db_url) == {("default", "gamma"): 3}
    assert await unserved_in_metrics(client) == {("default", "gamma"): 3}

    # A rolling deploy: a job of a type only the next release knows is
    # enqueued first; it waits, reported, until a worker that knows it starts.
    async with engine.begin() as s:
        await enqueue_many(s, "delta", [{}], queue="mail")
    assert unserved_in_status(db_url) == {("default", "gamma"): 3, ("mail", "delta"): 1}
    newer = spawn_worker("--shared", handlers="tests.handlers_next")
    newer_id = await working_id(conn, newer)
    await wait_for(lambda: done(conn, "delta", 1), timeout=TIMEOUT, message="delta done")
    assert await ran_by(conn, "delta") == {(newer_id, "next", newer.pid)}
    assert unserved_in_status(db_url) == {("default", "gamma"): 3}
    assert await unserved_in_metrics(client) == {("default", "gamma"): 3}

    for w in (left, right, newer):
        await w.stop()
    # No worker left: every waiting job is one that no live worker takes.
    await wait_for(lambda: conn.fetchval("SELECT count(*) = 0 FROM jobqueue_workers"),
                   timeout=TIMEOUT, message="the workers gone")
    async with engine.begin() as s:
        await enqueue_many(s, "alpha", [{}])
    assert unserved_in_status(db_url) == {("default", "gamma"): 3, ("default", "alpha"): 1}
