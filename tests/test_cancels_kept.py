"""A cancel the worker was asked to carry out is kept, wherever its job is
(issue 49, item 1): the job ends `failed`, error_message `cancelled`, and
nothing its handler wrote commits.

Each test runs a real `jobqueue worker` process (`tests.cancel_handlers`),
first proves where the job is (running, done and waiting for its batch's
commit, not started in its batch behind a slow job, its outcome being
written), then cancels it with `jobqueue.control.cancel`, which answers that
the worker was asked (the job is one a worker holds), and waits until the
worker says it heard the request before the slow job may go on: so every
test exercises the place it names, not a race.
"""

from __future__ import annotations

import signal
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from jobqueue import control, db, enqueue, enqueue_many
from jobqueue.testing import WorkerProcess, wait_for
from jobqueue.worker.cancels import Released
from jobqueue.worker.handler import ClaimedJob
from jobqueue.worker.outcome import Outcomes, overturn

TIMEOUT = 60
HANDLERS = "tests.cancel_handlers"


async def _events(conn: asyncpg.Connection, job_id: uuid.UUID) -> list[str]:
    return [r["kind"] for r in await conn.fetch(
        "SELECT kind FROM events WHERE job_id = $1 ORDER BY at", job_id)]


async def _effects(conn: asyncpg.Connection) -> dict[uuid.UUID, int]:
    """How many committed writes each job has."""
    return {r["job_id"]: r["n"] for r in await conn.fetch(
        "SELECT job_id, count(*) AS n FROM effects GROUP BY job_id")}


async def _started(conn: asyncpg.Connection, job_id: uuid.UUID) -> bool:
    return "started" in await _events(conn, job_id)


async def _all_finished(conn: asyncpg.Connection, n: int) -> bool:
    return await conn.fetchval(
        "SELECT count(*) FROM jobs WHERE status IN ('completed', 'failed')") == n


async def _in_one_quick_batch(conn: asyncpg.Connection, *ids: uuid.UUID) -> bool:
    """A quick batch still running holds all of `ids` (its ledger row names
    them, and its transaction is in progress), and the table shows them
    waiting: nothing of the batch has committed."""
    held = await conn.fetchval(
        "SELECT count(*) FROM jobqueue_batches WHERE job_ids @> $1::uuid[] "
        "AND pg_xact_status(CAST(CAST(xid AS text) AS xid8)) = 'in progress'", list(ids))
    statuses = {r["status"] for r in await conn.fetch(
        "SELECT status FROM jobs WHERE id = ANY($1::uuid[])", list(ids))}
    return held == 1 and statuses == {"pending"}


async def _in_one_claimed_batch(conn: asyncpg.Connection, ids: list[uuid.UUID]) -> bool:
    """All of `ids` are claimed (`processing`) by one worker: with one lane,
    by its one batch."""
    rows = await conn.fetch("SELECT status, worker_id FROM jobs WHERE id = ANY($1::uuid[])",
                            ids)
    return len(rows) == len(ids) and {(r["status"], r["worker_id"]) for r in rows} == {
        ("processing", rows[0]["worker_id"])}


async def _cancel(engine: AsyncEngine, worker: WorkerProcess, job_id: uuid.UUID) -> None:
    """Cancel a job a worker holds: the answer is that its worker was asked
    (`cancelling` in the API's words); then wait until the worker heard it."""
    async with engine.begin() as s:
        outcome = await control.cancel(s, job_id)
    assert not outcome.cancelled, outcome  # a worker holds it: asked, not done at once
    await wait_for(lambda: f"cancelling job {job_id}" in worker.log(), timeout=TIMEOUT,
                   message="the worker heard the cancel")


async def _assert_cancelled(conn: asyncpg.Connection, job_id: uuid.UUID, *,
                            attempts: int = 0) -> None:
    """Failed for good as a cancel leaves it, its writes gone."""
    row = await conn.fetchrow("SELECT status, error_message, retry_count, result "
                              "FROM jobs WHERE id = $1", job_id)
    assert dict(row) == {"status": "failed", "error_message": "cancelled",
                         "retry_count": attempts, "result": None}, dict(row)
    assert job_id not in await _effects(conn)


async def _assert_others_completed(conn: asyncpg.Connection, ids: list[uuid.UUID],
                                   cancelled: uuid.UUID) -> None:
    """The other jobs completed, each with its write committed once."""
    others = [i for i in ids if i != cancelled]
    statuses = {r["status"] for r in await conn.fetch(
        "SELECT status FROM jobs WHERE id = ANY($1::uuid[])", others)}
    assert statuses == {"completed"}
    effects = await _effects(conn)
    assert [effects.get(i) for i in others] == [1] * len(others)


@pytest.fixture
def spawn(spawn_worker: Any) -> Any:
    def start(*args: str) -> WorkerProcess:
        return spawn_worker("--concurrency", "1", *args, handlers=HANDLERS)
    return start


async def _slow_quick_batch(engine: AsyncEngine, conn: asyncpg.Connection, spawn: Any,
                            gate: Path) -> tuple[list[uuid.UUID], WorkerProcess]:
    """A quiet job first (a lane's first job is claimed alone, to learn the
    pace: these jobs are fast), then ten together, which one quick batch
    takes. The fourth waits for the gate and holds the batch past its 2 s,
    so the batch stops after it. Their ids and the worker, once the fourth
    has started."""
    async with engine.begin() as s:
        await enqueue(s, "step", {"quiet": True})
    payloads: list[dict[str, Any]] = [{} for _ in range(10)]
    payloads[3] = {"gate": str(gate), "min_s": 2.5}
    async with engine.begin() as s:
        ids = await enqueue_many(s, "step", payloads)
    worker = spawn("--quick-batch", "2")
    await wait_for(lambda: _started(conn, ids[3]), timeout=TIMEOUT, message="the slow job")
    return ids, worker


async def test_a_job_not_started_behind_a_slow_one_in_a_quick_batch(
        engine: AsyncEngine, conn: asyncpg.Connection, spawn: Any, tmp_path: Path) -> None:
    """The issue's case: the batch stops after its slow job, and the jobs it
    did not start are released; the cancelled one must not go with them."""
    gate = tmp_path / "gate"
    ids, worker = await _slow_quick_batch(engine, conn, spawn, gate)
    slow, target = ids[3], ids[6]
    assert await _in_one_quick_batch(conn, slow, target)
    assert await _events(conn, target) == []  # waiting behind it, not started
    await _cancel(engine, worker, target)
    gate.touch()
    await wait_for(lambda: _all_finished(conn, 11), timeout=TIMEOUT, message="every job")
    await worker.stop()
    await _assert_cancelled(conn, target)
    assert await _events(conn, target) == []  # it never ran
    await _assert_others_completed(conn, ids, target)


async def test_a_job_not_started_in_a_claimed_batch_that_fills(
        engine: AsyncEngine, conn: asyncpg.Connection, spawn: Any, tmp_path: Path) -> None:
    """A claimed batch stops where one more job could take it past 64
    savepoints, and hands back the jobs it did not start, which the lane
    claims again: the cancelled one must not be among them."""
    gate = tmp_path / "gate"
    payloads: list[dict[str, Any]] = [{} for _ in range(80)]
    payloads[59] = {"gate": str(gate)}
    async with engine.begin() as s:
        ids = await enqueue_many(s, "step", payloads)
    slow, target = ids[59], ids[69]  # the batch stops after the 64th
    worker = spawn("--quick-batch", "0", "--batch-size", "100", "--savepoints", "always")
    await wait_for(lambda: _started(conn, slow), timeout=TIMEOUT, message="the slow job")
    assert await _in_one_claimed_batch(conn, ids)
    assert await _events(conn, target) == []
    await _cancel(engine, worker, target)
    gate.touch()
    await wait_for(lambda: _all_finished(conn, 80), timeout=TIMEOUT, message="every job")
    await worker.stop()
    await _assert_cancelled(conn, target)
    assert await _events(conn, target) == []
    await _assert_others_completed(conn, ids, target)


async def test_a_job_handed_back_at_a_stop_and_claimed_by_another_worker(
        engine: AsyncEngine, conn: asyncpg.Connection, spawn: Any, tmp_path: Path) -> None:
    """SIGTERM: the running job finishes, the jobs not started go back to
    the queue, and the next worker claims them: not the cancelled one."""
    gate = tmp_path / "gate"
    payloads: list[dict[str, Any]] = [{} for _ in range(10)]
    payloads[3] = {"gate": str(gate)}
    async with engine.begin() as s:
        ids = await enqueue_many(s, "step", payloads)
    slow, target = ids[3], ids[6]
    worker = spawn("--quick-batch", "0", "--batch-size", "10", "--grace-period", "60")
    await wait_for(lambda: _started(conn, slow), timeout=TIMEOUT, message="the slow job")
    assert await _in_one_claimed_batch(conn, ids)
    assert await _events(conn, target) == []
    await _cancel(engine, worker, target)
    worker.signal(signal.SIGTERM)
    await wait_for(lambda: "stop requested" in worker.log(), timeout=TIMEOUT,
                   message="the worker stopping")
    gate.touch()
    assert await worker.wait(TIMEOUT) == 0, worker.log()
    back = [r["id"] for r in await conn.fetch(
        "SELECT id FROM jobs WHERE status = 'pending' AND worker_id IS NULL ORDER BY id")]
    assert back == [i for i in ids[4:] if i != target]  # the batch's unstarted jobs went back
    await spawn("--burst").finish(TIMEOUT)
    await _assert_cancelled(conn, target)
    assert await _events(conn, target) == []
    await _assert_others_completed(conn, ids, target)


async def test_a_job_done_and_waiting_for_its_quick_batch_to_commit(
        engine: AsyncEngine, conn: asyncpg.Connection, spawn: Any, tmp_path: Path) -> None:
    """Its handler returned, its write is in the batch, which runs a slow job
    and has not committed: the job still shows running (held), and its write
    must not commit. The batch runs again without it."""
    gate = tmp_path / "gate"
    ids, worker = await _slow_quick_batch(engine, conn, spawn, gate)
    slow, target = ids[3], ids[1]
    assert await _in_one_quick_batch(conn, slow, target)
    assert await _events(conn, target) == ["started", "finished"]  # done, not committed
    await _cancel(engine, worker, target)
    gate.touch()
    await wait_for(lambda: _all_finished(conn, 11), timeout=TIMEOUT, message="every job")
    await worker.stop()
    await _assert_cancelled(conn, target)
    assert await _events(conn, target) == ["started", "finished"]  # not run again
    await _assert_others_completed(conn, ids, target)


async def test_a_failed_attempt_waiting_in_its_batch_is_not_retried(
        engine: AsyncEngine, conn: asyncpg.Connection, spawn: Any, tmp_path: Path) -> None:
    """Its first attempt failed and would be retried; the batch runs a slow
    job before it records that: the cancel stops the retry."""
    gate = tmp_path / "gate"
    payloads: list[dict[str, Any]] = [{} for _ in range(10)]
    payloads[1] = {"fail_first": True}
    payloads[3] = {"gate": str(gate)}
    async with engine.begin() as s:
        ids = await enqueue_many(s, "step", payloads, max_retries=1)
    slow, target = ids[3], ids[1]
    worker = spawn("--quick-batch", "0", "--batch-size", "10", "--backoff-base", "0.05")
    await wait_for(lambda: _started(conn, slow), timeout=TIMEOUT, message="the slow job")
    assert await _in_one_claimed_batch(conn, ids)
    assert await _events(conn, target) == ["started"]  # it ran, and failed
    await _cancel(engine, worker, target)
    gate.touch()
    await wait_for(lambda: _all_finished(conn, 10), timeout=TIMEOUT, message="every job")
    await worker.stop()
    await _assert_cancelled(conn, target)
    assert await _events(conn, target) == ["started"]  # no second attempt
    history = await conn.fetchval("SELECT error_history::text FROM jobs WHERE id = $1", target)
    assert "asked to fail its first attempt" in history  # what the attempt did is kept
    await _assert_others_completed(conn, ids, target)


async def _one_running(engine: AsyncEngine, conn: asyncpg.Connection, spawn: Any,
                       job_type: str, payload: dict[str, Any], *worker_args: str
                       ) -> tuple[uuid.UUID, WorkerProcess]:
    """One job (one retry allowed), claimed and started by a new worker."""
    async with engine.begin() as s:
        target = await enqueue(s, job_type, payload, max_retries=1)
    worker = spawn(*worker_args)
    await wait_for(lambda: _started(conn, target), timeout=TIMEOUT, message="the job")
    assert await _in_one_claimed_batch(conn, [target])
    return target, worker


@pytest.mark.parametrize("job_type", ["step", "sync_step"], ids=["async", "sync"])
async def test_a_retry_being_recorded_when_the_cancel_comes(
        engine: AsyncEngine, conn: asyncpg.Connection, db_url: str, spawn: Any,
        tmp_path: Path, job_type: str) -> None:
    """The attempt failed and the worker is writing its retry down (held up
    here by a lock the test takes on the job's row) when it hears the
    cancel: the job must not run again."""
    gate = tmp_path / "gate"
    target, worker = await _one_running(engine, conn, spawn, job_type, {
        "gate": str(gate), "fail_first": True}, "--backoff-base", "0.05")
    blocker = await asyncpg.connect(**db.asyncpg_connect_args(db_url))
    try:
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute("SELECT FROM jobs WHERE id = $1 FOR SHARE", target)
        gate.touch()
        await wait_for(lambda: _worker_waits_for_a_lock(conn), timeout=TIMEOUT,
                       message="the worker's outcome waiting for the row")
        await _cancel(engine, worker, target)
        await tx.rollback()
    finally:
        await blocker.close()
    await wait_for(lambda: _all_finished(conn, 1), timeout=TIMEOUT, message="the job")
    await worker.stop()
    await _assert_cancelled(conn, target, attempts=1)  # its attempt was recorded, retry_count 1
    assert await _events(conn, target) == ["started"]  # and it did not run again


async def _worker_waits_for_a_lock(conn: asyncpg.Connection) -> bool:
    """A worker's statement that updates jobs (its outcome) waits for a lock."""
    return await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name LIKE 'jobqueue worker%' AND wait_event_type = 'Lock' "
        "AND query LIKE 'UPDATE jobs AS j%'") > 0


@pytest.mark.parametrize("job_type", ["step", "sync_step"], ids=["async", "sync"])
async def test_a_running_job_that_outlives_its_stop_and_the_grace_period(
        engine: AsyncEngine, conn: asyncpg.Connection, spawn: Any, tmp_path: Path,
        job_type: str) -> None:
    """The handler does not stop when asked (async code that swallows the
    cancellation, sync code that never calls the database again) and the
    worker, told to stop, abandons it after its grace period: the job goes
    back to the queue, and the next worker must not run it."""
    gate = tmp_path / "gate"
    target, worker = await _one_running(engine, conn, spawn, job_type, {
        "gate": str(gate), "stubborn": True}, "--grace-period", "0.5")
    await _cancel(engine, worker, target)
    assert await _in_one_claimed_batch(conn, [target])  # it carries on
    worker.signal(signal.SIGTERM)
    assert await worker.wait(TIMEOUT) == 0, worker.log()
    assert "abandoning" in worker.log()
    gate.touch()
    await spawn("--burst").finish(TIMEOUT)
    await _assert_cancelled(conn, target)
    assert await _events(conn, target) == ["started"]  # it did not run again


@pytest.mark.parametrize("job_type", ["step", "sync_step"], ids=["async", "sync"])
async def test_a_cancel_that_commits_after_the_worker_let_the_job_go(
        engine: AsyncEngine, conn: asyncpg.Connection, spawn: Any, tmp_path: Path,
        job_type: str) -> None:
    """`control.cancel` runs in the caller's transaction, and its request
    leaves when that commits: here the job is running when the cancel
    answers that its worker is asked, and waits for its retry when the
    request arrives. The worker let it go an instant before, as far as it
    knows, and must still carry the cancel out."""
    gate = tmp_path / "gate"
    target, worker = await _one_running(engine, conn, spawn, job_type, {
        "gate": str(gate), "fail_first": True}, "--backoff-base", "120")
    async with engine.begin() as s:
        outcome = await control.cancel(s, target)
        assert not outcome.cancelled and outcome.was == "processing"  # its worker is asked
        gate.touch()
        await wait_for(lambda: conn.fetchval("SELECT status = 'retrying' FROM jobs "
                                             "WHERE id = $1", target),
                       timeout=TIMEOUT, message="the retry recorded")
    # Committed: the request is on its way to a worker that no longer runs the job.
    await wait_for(lambda: _all_finished(conn, 1), timeout=15, message="the job cancelled")
    await worker.stop()
    await _assert_cancelled(conn, target, attempts=1)
    assert await _events(conn, target) == ["started"]


def _job(n: int, retry_count: int = 0) -> ClaimedJob:
    return ClaimedJob(uuid.UUID(int=n), "step", "{}", retry_count, 3, None, 0, 0, None, None,
                      None)


def test_a_cancel_overturns_every_outcome_that_would_not_end_the_job_but_a_failure() -> None:
    """`outcome.overturn`, alone: a success, a failure to be retried, a
    snooze and a job not started become failed for good, `cancelled` (the
    retried failure's traceback kept); a failure for good stands, and so
    does what nobody cancelled."""
    jobs = [_job(n) for n in range(7)]
    out = Outcomes()
    out.success(jobs[0].id, '"r"', 0.1)
    out.failure(jobs[1].id, "E: retried", True, 1.0, "trace 1")
    out.failure(jobs[2].id, "E: for good", False, 0.0, "trace 2")
    out.snooze(jobs[3].id, 5.0)
    out.not_started = [jobs[4].id, jobs[5].id]
    out.success(jobs[6].id, None, 0.2)
    changed = overturn(jobs, out, {j.id for j in jobs[:6]}, worker_id=1)
    assert changed == {jobs[n].id for n in (0, 1, 3, 4, 5)}
    assert out.done_ids == [jobs[6].id] and out.results == [None]
    assert out.snoozed_ids == [] and out.not_started == [] and out.waiting_again() == []
    failed = dict(zip(out.failed_ids, zip(out.errors, out.retry, out.traces, strict=True),
                      strict=True))
    assert failed == {jobs[2].id: ("E: for good", False, "trace 2"),
                      jobs[0].id: ("cancelled", False, None),
                      jobs[1].id: ("cancelled", False, "trace 1"),
                      jobs[3].id: ("cancelled", False, None),
                      jobs[4].id: ("cancelled", False, None),
                      jobs[5].id: ("cancelled", False, None)}
    assert overturn(jobs, out, {j.id for j in jobs[:6]}, worker_id=1) == set()  # decided


def test_released_jobs_are_remembered_for_a_while_and_taken_once() -> None:
    released = Released(linger=60)
    first, second = uuid.UUID(int=1), uuid.UUID(int=2)
    released.add([first, second])
    assert released.take(first) and not released.take(first)  # once
    released.discard([second])
    assert not released.take(second) and len(released) == 0
    gone = Released(linger=0)  # forgotten at once
    gone.add([first])
    gone.add([second])  # the first pruned as more come
    assert len(gone) == 1 and not gone.take(second)
