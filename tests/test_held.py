"""A job running in a quick batch looks running everywhere a job is shown.

A quick batch locks its jobs and runs them without marking them, so the
table says `pending` while a job runs: `jobqueue status`, the dashboard,
`/metrics` and the API read the batch ledger to show it running, with its
worker. Each test first proves the table still says `pending` (the job is
really in a quick batch), then reads every surface.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from jobqueue import HandlerRegistry, JobRunner, enqueue_many
from jobqueue.ops import routing, status
from jobqueue.ops.dashboard import pages
from jobqueue.testing import wait_for
from tests.conftest import run_cli


class Gate:
    """Handlers of `quick` jobs: done at once, except one that waits for the test."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.registry = HandlerRegistry()

        @self.registry.register("quick")
        async def quick(session: AsyncSession, payload: dict[str, Any]) -> None:
            if payload.get("hold"):
                self.entered.set()
                await asyncio.wait_for(self.release.wait(), 60)


@pytest.fixture
async def gate() -> Gate:
    return Gate()


@pytest.fixture
async def runner(db_url: str, gate: Gate) -> AsyncIterator[JobRunner]:
    """One lane whose quick batches last up to a second: fast jobs go in them."""
    runner = JobRunner(db_url, registry=gate.registry, install_signal_handlers=False,
                       concurrency=1, quick_batch=1.0, poll_interval=0.2)
    task = asyncio.create_task(runner.run())
    yield runner
    gate.release.set()
    runner.stop()
    await asyncio.wait_for(asyncio.shield(task), 30)


async def hold_one(engine: AsyncEngine, conn: asyncpg.Connection, gate: Gate) -> uuid.UUID:
    """Teach the lane its jobs are fast, then send three together, the last
    of which waits: the three go in one quick batch. The held job's id."""
    async with engine.begin() as s:
        await enqueue_many(s, "quick", [{} for _ in range(3)])

    async def done(n: int) -> bool:
        return await conn.fetchval("SELECT count(*) FROM jobs WHERE status = 'completed'") == n
    await wait_for(lambda: done(3), timeout=30, message="the first three jobs")
    async with engine.begin() as s:
        ids = await enqueue_many(s, "quick", [{}, {}, {"hold": True}])
    await asyncio.wait_for(gate.entered.wait(), 30)
    held = ids[-1]
    # What the table says: pending, no start, no worker. The surfaces must say otherwise.
    row = await conn.fetchrow("SELECT status, started_at, worker_id FROM jobs WHERE id = $1",
                              held)
    assert dict(row) == {"status": "pending", "started_at": None, "worker_id": None}
    return held


async def test_status_and_counts_show_a_held_job_running_with_its_worker(
    engine: AsyncEngine, conn: asyncpg.Connection, gate: Gate, runner: JobRunner, db_url: str
) -> None:
    held = await hold_one(engine, conn, gate)
    job = await status.job_detail(conn, held)
    assert job is not None
    assert job["status"] == "processing" and job["worker_id"] == runner.worker_id
    assert job["started_at"] is not None and job["attempts"] == 1
    # Nothing counts as waiting: the batch's jobs, the held one and any it
    # finished (their outcome commits with it), count as running.
    counts = (await routing.read(conn)).counts()
    assert counts["pending"] == 0 and counts["processing"] >= 1
    assert counts["processing"] + counts["completed"] == 6
    queue = (await routing.read(conn)).queues()[0]
    assert queue["running"] == counts["processing"] and queue["counts"]["pending"] == 0

    shown = run_cli("status", str(held), url=db_url)
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"status\s+processing", shown.stdout), shown.stdout
    assert str(runner.worker_id) in shown.stdout

    gate.release.set()
    await wait_for(lambda: conn.fetchval("SELECT status = 'completed' FROM jobs WHERE id = $1",
                                         held), timeout=30, message="the held job done")
    job = await status.job_detail(conn, held)
    assert job is not None and job["status"] == "completed" and job["attempts"] == 1
    assert (await routing.read(conn)).counts()["processing"] == 0


async def test_the_api_the_dashboard_and_metrics_show_a_held_job_running(
    engine: AsyncEngine, conn: asyncpg.Connection, gate: Gate, runner: JobRunner,
    client: httpx.AsyncClient
) -> None:
    held = await hold_one(engine, conn, gate)
    one = (await client.get(f"/jobs/{held}")).json()
    assert one["status"] == "processing" and one["attempts"] == 1
    assert one["worker_id"] == runner.worker_id and one["started_at"] is not None

    running = (await client.get("/jobs", params={"status": "processing"})).json()["jobs"]
    assert str(held) in [j["id"] for j in running]
    assert {j["worker_id"] for j in running} == {runner.worker_id}
    waiting = (await client.get("/jobs", params={"status": "pending"})).json()["jobs"]
    assert waiting == []
    everything = (await client.get("/jobs")).json()["jobs"]
    assert {j["status"] for j in everything} == {"processing", "completed"}

    async with engine.connect() as c:
        page = await pages.list_jobs(c, "running")
        assert str(held) in [str(r["id"]) for r in page.rows]
        assert {r["worker_id"] for r in page.rows} == {runner.worker_id}
        assert (await pages.list_jobs(c, "waiting")).rows == []
        job = await pages.job(c, held)
        assert job is not None and job["status"] == "processing"
    html = (await client.get("/jobs", params={"status": "running"},
                             headers={"accept": "text/html"})).text
    assert str(held) in html or "processing" in html

    metrics = (await client.get("/metrics")).text
    assert re.search(rf'jobqueue_jobs\{{[^}}]*status="processing"[^}}]*\}} {len(running)}\.0',
                     metrics), metrics
    assert not re.search(r'jobqueue_jobs\{[^}]*status="pending"[^}]*\} [1-9]', metrics)


async def test_a_refused_retry_names_a_held_job_running_as_the_api_shows_it(
    engine: AsyncEngine, conn: asyncpg.Connection, gate: Gate, runner: JobRunner,
    client: httpx.AsyncClient
) -> None:
    """Issue 49, item 5: the 409 said the job `is pending` (the table's
    word) while `GET /jobs/{id}` showed it processing."""
    held = await hold_one(engine, conn, gate)
    shown = (await client.get(f"/jobs/{held}")).json()["status"]
    refused = await client.post(f"/jobs/{held}/retry")
    assert shown == "processing"
    assert refused.status_code == 409, refused.text
    assert refused.json()["detail"] == (f"job {held} is processing; "
                                        "only failed jobs can be retried")
