"""Waiting for a job (`jobqueue.wait`) and cancelling one (`jobqueue.control.cancel`),
against the real database: the notifications are PostgreSQL's own."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

import jobqueue
from jobqueue import HandlerRegistry, RetryPolicy, control, enqueue
from jobqueue.api import TOKEN_ENV, create_app
from jobqueue.schema.locks import CANCEL_PREFIX, CHANNEL, DONE_CHANNEL, WORKER_LOCK_CLASS
from jobqueue.schema.queries import queries
from jobqueue.testing import drain, wait_for
from jobqueue.worker import WorkerConfig, upkeep
from tests.conftest import run_cli

pytestmark = pytest.mark.asyncio


@pytest.fixture
def only_notifications(monkeypatch: pytest.MonkeyPatch) -> None:
    """No safety-net rereads within a test: a waiter that returns was woken
    by a notification."""
    monkeypatch.setattr(control, "RECHECK_FIRST", 3600.0)


def registry_of(outcome: str) -> HandlerRegistry:
    registry = HandlerRegistry()

    @registry.register("t")
    async def handler(session: Any, payload: dict[str, Any]) -> dict[str, Any]:
        if outcome == "fail":
            raise RuntimeError("boom")
        return {"echo": payload}

    return registry


async def new_job(engine: AsyncEngine, **options: Any) -> uuid.UUID:
    async with engine.begin() as c:
        return await enqueue(c, "t", {"n": 1}, **options)


async def waiters(conn: asyncpg.Connection, job_id: uuid.UUID) -> int:
    return await conn.fetchval("SELECT count(*) FROM jobqueue_waiters WHERE job_id = $1",
                               job_id)


async def heard(conn: asyncpg.Connection, channel: str) -> list[str]:
    """Payloads that arrive on `channel` from now on (the list fills in)."""
    payloads: list[str] = []
    await conn.add_listener(channel, lambda _c, _p, _ch, payload: payloads.append(payload))
    return payloads


async def all_heard(engine: AsyncEngine, payloads: list[str], channel: str) -> list[str]:
    """Everything sent on `channel` by transactions that committed so far:
    notifications arrive in commit order, so once a marker sent now is
    heard, nothing earlier is still on its way."""
    async with engine.begin() as c:
        await c.exec_driver_sql(f"NOTIFY {channel}, 'marker'")
    await wait_for(lambda: "marker" in payloads, message="the marker")
    return payloads[:payloads.index("marker")]


async def test_wait_returns_the_completed_job_when_a_worker_finishes_it(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection,
        only_notifications: None) -> None:
    job_id = await new_job(engine)
    waiting = asyncio.create_task(jobqueue.wait(job_id, timeout=30, database=db_url))
    await wait_for(lambda: waiters(conn, job_id), message="the waiter's row")
    assert not waiting.done()  # pending: nothing to return yet

    await drain(db_url, registry=registry_of("complete"))
    job = await asyncio.wait_for(waiting, 10)
    assert isinstance(job, jobqueue.FinishedJob)
    assert (job.id, job.status, job.result, job.error_history) == (
        job_id, "completed", {"echo": {"n": 1}}, [])
    assert job.completed_at is not None and not job.cancelled
    assert await waiters(conn, job_id) == 0  # it deleted its row on the way out


async def test_a_job_that_finished_before_the_wait_is_returned_at_once(
        engine: AsyncEngine, db_url: str, only_notifications: None) -> None:
    job_id = await new_job(engine)
    await drain(db_url, registry=registry_of("complete"))
    job = await jobqueue.wait(str(job_id), timeout=10, database=engine)
    assert job.status == "completed" and job.result == {"echo": {"n": 1}}


async def test_retrying_is_not_finished_failing_for_good_is(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection,
        only_notifications: None) -> None:
    job_id = await new_job(engine, max_retries=1)
    done = await heard(conn, DONE_CHANNEL)
    waiting = asyncio.create_task(jobqueue.wait(job_id, timeout=30, database=db_url))
    await wait_for(lambda: waiters(conn, job_id), message="the waiter's row")
    # Both attempts, each in a transaction of its own: the first ends
    # `retrying`, which must not wake the waiter; the second `failed`.
    await drain(db_url, registry=registry_of("fail"),
                retry_policy=RetryPolicy(base=0, jitter=0))
    job = await asyncio.wait_for(waiting, 10)
    assert job.status == "failed" and job.error_message == "RuntimeError: boom"
    assert [e["attempt"] for e in job.error_history] == [1, 2] and job.retry_count == 1
    assert await all_heard(engine, done, DONE_CHANNEL) == [str(job_id)]  # not for the retry


async def test_nobody_waiting_means_nothing_is_sent(engine: AsyncEngine, db_url: str,
                                                   conn: asyncpg.Connection) -> None:
    done = await heard(conn, DONE_CHANNEL)
    waited, alone = await new_job(engine), await new_job(engine)
    waiting = asyncio.create_task(jobqueue.wait(waited, timeout=30, database=db_url))
    await wait_for(lambda: waiters(conn, waited), message="the waiter's row")
    await drain(db_url, registry=registry_of("complete"))  # both in one batch
    await asyncio.wait_for(waiting, 10)
    # The job nobody waited for was not announced.
    assert await all_heard(engine, done, DONE_CHANNEL) == [str(waited)]
    assert await conn.fetchval("SELECT status FROM jobs WHERE id = $1", alone) == "completed"


async def test_wait_times_out_and_knows_no_unknown_job(engine: AsyncEngine, db_url: str,
                                                       conn: asyncpg.Connection) -> None:
    job_id = await new_job(engine)
    with pytest.raises(TimeoutError, match=f"job {job_id} did not finish within 0.2 s"):
        await jobqueue.wait(job_id, timeout=0.2, database=db_url)
    assert await waiters(conn, job_id) == 0  # the row went with the waiter
    with pytest.raises(LookupError, match="no job"):
        await jobqueue.wait(uuid.uuid4(), timeout=5, database=db_url)
    with pytest.raises(ValueError, match="not a job id"):
        await jobqueue.wait("42", timeout=5, database=db_url)
    for bad in (0, -1, True, "10"):
        with pytest.raises(ValueError, match="timeout must be"):
            await jobqueue.wait(job_id, timeout=bad, database=db_url)  # type: ignore[arg-type]


async def test_a_job_that_took_its_worker_down_for_good_wakes_its_waiter(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection,
        only_notifications: None) -> None:
    """The rescue fails a job that was all its dead worker ran, with no
    retries left: that is an end too, and its waiter hears of it."""
    job_id = await new_job(engine, max_retries=0)
    await conn.execute("UPDATE jobs SET status = 'processing', worker_id = 99, "
                       "started_at = now() WHERE id = $1", job_id)  # worker 99 holds no lock
    waiting = asyncio.create_task(jobqueue.wait(job_id, timeout=30, database=db_url))
    await wait_for(lambda: waiters(conn, job_id), message="the waiter's row")
    row = await queries["rescue"].fetchrow(conn, worker_lock_class=WORKER_LOCK_CLASS,
                                           base=1.0, factor=2.0, cap=60.0)
    assert row is not None and (row["n"], row["failed"], row["told"]) == (1, 1, 1)
    job = await asyncio.wait_for(waiting, 10)
    assert job.status == "failed" and "died while running it" in (job.error_message or "")


async def test_a_job_being_finished_is_read_once_its_transaction_ends(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection,
        only_notifications: None) -> None:
    """A quick batch records its job before the waiter's row exists, so its
    statement cannot notify it; the waiter's read waits for the batch's lock
    and sees the outcome when it commits, instead of the job as it was."""
    job_id = await new_job(engine)
    batch = await asyncpg.connect(**jobqueue.db.asyncpg_connect_args(db_url))
    try:
        tx = batch.transaction()
        await tx.start()
        taken = await queries["take"].fetch(batch, queue="default", arm_types=["t"], limit=10,
                                              priorities=[0], floors=[None],
                                              floor_ids=[None])
        assert [r["id"] for r in taken] == [job_id]
        await queries["complete"].fetch(batch, ids=[job_id], results=["7"], worker_id=1,
                                        taken=True)
        waiting = asyncio.create_task(jobqueue.wait(job_id, timeout=30, database=db_url))
        await wait_for(lambda: conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'jobqueue wait' "
            "AND wait_event_type = 'Lock' AND datname = current_database()"),
            message="the waiter blocked on the batch's lock")
        assert not waiting.done()
        await tx.commit()
        job = await asyncio.wait_for(waiting, 10)
        assert job.status == "completed" and job.result == 7
    finally:
        await batch.close()


async def test_a_missed_notification_costs_a_reread_not_the_timeout(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(control, "RECHECK_FIRST", 0.1)
    job_id = await new_job(engine)
    waiting = asyncio.create_task(jobqueue.wait(job_id, timeout=30, database=db_url))
    await wait_for(lambda: waiters(conn, job_id), message="the waiter's row")
    # Finished by a statement that notifies nobody (as a `complete` that
    # started before the waiter's row was committed would).
    await conn.execute("UPDATE jobs SET status = 'completed', completed_at = now() "
                       "WHERE id = $1", job_id)
    job = await asyncio.wait_for(waiting, 10)
    assert job.status == "completed"


async def test_archive_forgets_waiters_whose_connection_or_job_is_gone(
        engine: AsyncEngine, conn: asyncpg.Connection) -> None:
    job_id = await new_job(engine)
    mine = await conn.fetchval("SELECT pg_backend_pid()")
    dead = await conn.fetchval("SELECT max(pid) + 100000 FROM pg_stat_activity")
    await conn.executemany("INSERT INTO jobqueue_waiters (job_id, pid) VALUES ($1, $2)",
                           [(job_id, mine), (job_id, dead), (uuid.uuid4(), mine)])
    # A row older than this backend: its pid was reused, its caller is gone.
    await conn.execute("INSERT INTO jobqueue_waiters (job_id, pid, since) "
                       "VALUES ($1, $2, '2000-01-01')", uuid.uuid4(), mine)
    assert await conn.fetchval("SELECT count(*) FROM jobqueue_waiters") == 4
    moved, _ = await upkeep.archive(conn, WorkerConfig(archive_after=0))
    assert moved == 0  # the job is waiting: it stays
    left = await conn.fetch("SELECT job_id, pid FROM jobqueue_waiters")
    assert [tuple(r) for r in left] == [(job_id, mine)]


async def test_cancel_a_waiting_job_at_once_and_its_waiter_hears(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection,
        only_notifications: None) -> None:
    job_id = await new_job(engine)
    asked = await heard(conn, CHANNEL)
    waiting = asyncio.create_task(jobqueue.wait(job_id, timeout=30, database=db_url))
    # Once it has read the job and listens (the cancel during the read is the
    # next test's).
    await wait_for(lambda: conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'jobqueue wait' "
        "AND datname = current_database() AND state = 'idle' AND query = $1",
        queries["wait_check"].positional), message="the waiter listening")
    assert await waiters(conn, job_id) == 1
    async with engine.begin() as c:
        outcome = await control.cancel(c, job_id, reason="customer left")
    assert outcome == control.Cancellation(job_id, "pending", True)
    job = await asyncio.wait_for(waiting, 10)
    assert job.status == "failed" and job.cancelled
    assert job.error_message == "cancelled: customer left" and job.error_history == []
    # No worker was bothered (the channel's other news, new jobs, does not count).
    assert not [p for p in await all_heard(engine, asked, CHANNEL)
                if p.startswith(CANCEL_PREFIX)]

    async with engine.begin() as c:
        with pytest.raises(control.JobFinished, match=f"job {job_id} is failed; it has "
                                                      "finished"):
            await control.cancel(c, job_id)
        with pytest.raises(LookupError, match="no job"):
            await control.cancel(c, uuid.uuid4())
        with pytest.raises(ValueError, match="NUL"):
            await control.cancel(c, job_id, reason="a\x00b")


async def test_a_waiters_read_does_not_pass_for_a_worker_holding_the_job(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection) -> None:
    """A cancel that meets a waiter's read of the job in progress: the read
    locks the row (to wait for a batch that holds it), but that lock is not
    a worker's, so the cancel must not skip the job and leave it pending
    while it only asks the workers."""
    job_id = await new_job(engine)
    reader = await asyncpg.connect(**jobqueue.db.asyncpg_connect_args(db_url))
    try:
        async with reader.transaction():
            row = await queries["wait_check"].fetchrow(reader, job_id=job_id)
            assert row["status"] == "pending"
            # The read's lock is really there: a claim passes the row by.
            assert await conn.fetchval("SELECT count(*) FROM (SELECT id FROM jobs "
                                       "WHERE id = $1 FOR UPDATE SKIP LOCKED) AS l",
                                       job_id) == 0
            async with engine.begin() as c:
                outcome = await asyncio.wait_for(control.cancel(c, job_id), 10)
        assert outcome == control.Cancellation(job_id, "pending", True)
    finally:
        await reader.close()
    assert await conn.fetchval("SELECT status FROM jobs WHERE id = $1", job_id) == "failed"


async def test_cancel_asks_the_worker_when_one_has_the_job(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection) -> None:
    """A claimed job, and one locked in a quick batch (still `pending`): both
    are left to their worker, which is asked on the workers' channel, and the
    cancel does not wait for the batch's lock."""
    claimed, locked = await new_job(engine), await new_job(engine, queue="quick")
    await queries["claim"].fetch(conn, limit=1, worker_id=42, queue="default",
                                 arm_types=["t"], priorities=[0], floors=[None],
                                              floor_ids=[None])
    asked = await heard(conn, CHANNEL)
    batch = await asyncpg.connect(**jobqueue.db.asyncpg_connect_args(db_url))
    try:
        async with batch.transaction():
            taken = await queries["take"].fetch(batch, queue="quick", arm_types=["t"],
                                                limit=10, priorities=[0], floors=[None],
                                              floor_ids=[None])
            assert [r["id"] for r in taken] == [locked]
            for job_id, was in ((claimed, "processing"), (locked, "pending")):
                async with engine.begin() as c:
                    outcome = await asyncio.wait_for(control.cancel(c, job_id), 10)
                assert outcome == control.Cancellation(job_id, was, False)
    finally:
        await batch.close()
    await wait_for(lambda: len(asked) >= 2, message="both requests")
    assert asked == [f"cancel:{claimed}", f"cancel:{locked}"]
    rows = dict(await conn.fetch("SELECT id, status FROM jobs"))
    assert rows == {claimed: "processing", locked: "pending"}  # the workers decide


async def test_cancel_running_jobs_of_a_real_worker(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection, spawn_worker: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end: a `jobqueue worker` process runs two slow jobs; one is
    cancelled by `jobqueue cancel`, the other by `DELETE /jobs/{id}`. Each
    ends `failed` `cancelled`, its write rolled back, and each caller saw
    the outcome instead of "still running"."""
    async with engine.begin() as c:
        ids = [await enqueue(c, "effect", {"sleep": 60}) for _ in range(2)]
    worker = spawn_worker("--concurrency", "2")
    await wait_for(lambda: conn.fetchval(
        "SELECT count(*) = 2 FROM events WHERE kind = 'started'"), timeout=30,
        message="both jobs running")

    out = await asyncio.to_thread(run_cli, "cancel", str(ids[0]), "--wait", "20", url=db_url)
    assert (out.returncode, out.stdout.strip()) == (
        0, f"job {ids[0]} cancelled: the worker running it stopped it"), out.stderr
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    app = create_app(db_url, cancel_wait=20)  # a generous wait: CI machines are slow
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://localhost") as client:
        response = await client.delete(f"/jobs/{ids[1]}")
    await app.state.jobqueue_engine.dispose()
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "failed" and "cancelling" not in response.json()

    rows = await conn.fetch("SELECT status, error_message FROM jobs ORDER BY id")
    assert [tuple(r) for r in rows] == [("failed", "cancelled")] * 2
    assert await conn.fetchval("SELECT count(*) FROM effects") == 0  # their writes rolled back
    assert worker.proc.poll() is None  # the worker carries on
