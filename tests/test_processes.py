"""Real `jobqueue worker` processes and real signals."""

from __future__ import annotations

import json
import signal

import asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine

from jobqueue import enqueue_many
from jobqueue.testing import WorkerProcess, wait_for
from jobqueue.worker import ACTIVE_KEY, LOCK_CLASS
from tests.conftest import ROOT

TIMEOUT = 30


async def _started(conn: asyncpg.Connection, n: int = 1) -> bool:
    return await conn.fetchval("SELECT count(*) FROM events WHERE kind = 'started'") >= n


async def _active_lock_holders(conn: asyncpg.Connection) -> int:
    return await conn.fetchval(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
        "AND classid = $1 AND objid = $2 AND objsubid = 2 AND database = "
        "(SELECT oid FROM pg_database WHERE datname = current_database())",
        LOCK_CLASS, ACTIVE_KEY)


def _final_report(log: str) -> dict:
    """The report a worker logs as it stops."""
    line = next(ln for ln in reversed(log.splitlines()) if " stopped: {" in ln)
    return json.loads(line.split(" stopped: ", 1)[1])


async def _wait_exit(worker: WorkerProcess, timeout: float = TIMEOUT) -> int:
    return await worker.wait(timeout)


async def test_sigterm_finishes_the_running_job_and_hands_back_the_rest(
    engine: AsyncEngine, spawn_worker, conn: asyncpg.Connection
) -> None:
    async with engine.begin() as s:
        ids = await enqueue_many(s, "effect", [{"sleep": 0.5} for _ in range(10)])
    # --quick-batch 0: the batch of ten is claimed whole, though its jobs are slow.
    worker = spawn_worker("--batch-size", "10", "--quick-batch", "0", "--grace-period", "20")
    await wait_for(lambda: _started(conn), timeout=TIMEOUT, message="the first job to start")
    assert await conn.fetchval("SELECT count(*) FROM jobs WHERE status = 'processing'") == 10

    worker.proc.send_signal(signal.SIGTERM)
    assert await _wait_exit(worker) == 0, worker.log()

    rows = await conn.fetch("SELECT id, status, retry_count, error_history::text AS h, "
                            "started_at FROM jobs")
    by_status: dict[str, int] = {}
    for r in rows:
        by_status[r["status"]] = by_status.get(r["status"], 0) + 1
    started = await conn.fetchval("SELECT count(*) FROM events WHERE kind = 'started'")
    finished = await conn.fetchval("SELECT count(*) FROM events WHERE kind = 'finished'")
    # The job that was running finished and committed; the others never started
    # and went back to the queue untouched: no attempt counted, nothing left processing.
    assert started == finished >= 1
    assert by_status == {"completed": finished, "pending": 10 - finished}
    assert all(r["retry_count"] == 0 and r["h"] == "[]" for r in rows)
    assert all(r["started_at"] is None for r in rows if r["status"] == "pending")
    assert await conn.fetchval("SELECT count(*) FROM effects") == finished
    assert await _active_lock_holders(conn) == 0
    report = _final_report(worker.log())
    assert report["processed"] == finished and report["handed_back"] == len(ids) - finished


async def test_grace_period_over_abandons_the_job_without_counting_an_attempt(
    engine: AsyncEngine, spawn_worker, conn: asyncpg.Connection
) -> None:
    async with engine.begin() as s:
        [job_id] = await enqueue_many(s, "effect", [{"sleep": 120}])
    worker = spawn_worker("--grace-period", "0.5")
    await wait_for(lambda: _started(conn), timeout=TIMEOUT, message="the job to start")

    worker.proc.send_signal(signal.SIGTERM)
    assert await _wait_exit(worker) == 0, worker.log()

    row = await conn.fetchrow("SELECT * FROM jobs WHERE id = $1", job_id)
    assert row["status"] == "pending" and row["retry_count"] == 0
    assert row["error_history"] == "[]" and row["worker_id"] is None
    assert await conn.fetchval("SELECT count(*) FROM effects") == 0  # rolled back
    assert await _active_lock_holders(conn) == 0


async def test_second_signal_abandons_at_once(
    engine: AsyncEngine, spawn_worker, conn: asyncpg.Connection
) -> None:
    async with engine.begin() as s:
        await enqueue_many(s, "effect", [{"sleep": 120}])
    worker = spawn_worker("--grace-period", "600")
    await wait_for(lambda: _started(conn), timeout=TIMEOUT, message="the job to start")
    worker.proc.send_signal(signal.SIGTERM)
    await wait_for(lambda: "stop requested" in worker.log(), timeout=TIMEOUT,
                   message="the first signal to be seen")
    worker.proc.send_signal(signal.SIGINT)
    assert await _wait_exit(worker) == 0, worker.log()
    assert await conn.fetchval("SELECT status FROM jobs") == "pending"
    assert await conn.fetchval("SELECT count(*) FROM effects") == 0


async def test_only_one_worker_process_is_active_and_it_did_all_the_work(
    engine: AsyncEngine, spawn_worker, conn: asyncpg.Connection
) -> None:
    first = spawn_worker()
    second = spawn_worker()
    await wait_for(lambda: _active_lock_holders(conn), timeout=TIMEOUT, message="an active worker")
    await wait_for(
        lambda: conn.fetchval("SELECT count(*) FROM pg_stat_activity "
                              "WHERE application_name LIKE 'jobqueue worker % standby %' "
                              "AND datname = current_database()"),
        timeout=TIMEOUT, message="a standby worker")
    async with engine.begin() as s:
        await enqueue_many(s, "effect", [{} for _ in range(30)])
    await wait_for(
        lambda: conn.fetchval("SELECT count(*) = 30 FROM jobs WHERE status = 'completed'"),
        timeout=TIMEOUT, message="30 completed jobs")

    pids = await conn.fetch("SELECT DISTINCT worker_pid FROM events")
    assert len(pids) == 1
    active_pid = pids[0]["worker_pid"]
    assert active_pid in (first.pid, second.pid)
    # The jobs carry the id of the worker whose connection holds the active lock.
    active_name = await conn.fetchval(
        "SELECT application_name FROM pg_stat_activity "
        "WHERE application_name LIKE 'jobqueue worker % active %' "
        "AND datname = current_database()")
    worker_ids = await conn.fetch("SELECT DISTINCT worker_id FROM jobs")
    assert [str(r["worker_id"]) for r in worker_ids] == [active_name.split()[2]]
    assert active_name.endswith(f":{active_pid}")

    for w in (first, second):
        w.proc.send_signal(signal.SIGTERM)
    assert await _wait_exit(first) == 0 and await _wait_exit(second) == 0


async def test_sigterm_while_the_handlers_import_is_a_clean_stop(
    db_url: str, tmp_path, conn: asyncpg.Connection
) -> None:
    """A supervisor may stop a worker that is still importing its handlers:
    it exits 0, having taken nothing, instead of dying of the signal."""
    worker = WorkerProcess(db_url, tmp_path / "worker.log", "--import", "tests.slow_import",
                           cwd=ROOT, env={"JOBQUEUE_TEST_IMPORT_GATE": str(tmp_path)})
    try:
        await wait_for(lambda: (tmp_path / "importing").exists(), timeout=TIMEOUT,
                       message="the worker importing its handlers")
        worker.signal(signal.SIGTERM)
        (tmp_path / "go").touch()
        assert await _wait_exit(worker) == 0, worker.log()
    finally:
        worker.close()
    assert "stop requested" in worker.log()
    assert await conn.fetchval("SELECT count(*) FROM jobqueue_workers") == 0
