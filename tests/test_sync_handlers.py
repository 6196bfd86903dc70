"""Sync (plain `def`) handlers: run in threads off the event loop, their writes
atomic with the job's outcome, in a bounded pool; real worker processes where
it is about processes (blocking, the bound, signals)."""

from __future__ import annotations

import asyncio
import functools
import json
import signal
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from jobqueue import (
    HandlerRegistry,
    JobRunner,
    RetryPolicy,
    current_job,
    db,
    enqueue,
    enqueue_many,
    queues,
)
from jobqueue.schema.locks import CANCEL_PREFIX, CHANNEL
from jobqueue.testing import WorkerProcess, drain, in_state, wait_for, worker_state
from jobqueue.worker import Snooze, WorkerConfig, threads

TIMEOUT = 30
NOW = RetryPolicy(base=0.0, jitter=0.0)  # retries due at once: a burst drain runs them all


# -- what registers ---------------------------------------------------------------


class Handlers:
    def method(self, session: Any, payload: dict[str, Any]) -> None: ...

    async def async_method(self, session: Any, payload: dict[str, Any]) -> None: ...


def plain(session: Any, payload: dict[str, Any], extra: int = 0) -> None: ...


async def coroutine(session: Any, payload: dict[str, Any]) -> None: ...


def test_plain_and_async_functions_register_and_say_which_they_are() -> None:
    registry = HandlerRegistry()
    registry.add("plain", plain)
    registry.add("partial", functools.partial(plain, extra=1))
    registry.add("method", Handlers().method)
    registry.add("lambda", lambda session, payload: None)
    registry.add("async", coroutine)
    registry.add("async_method", Handlers().async_method)
    assert [t for t in registry if registry.is_sync(t)] == ["lambda", "method", "partial",
                                                            "plain"]
    registry.add("plain", coroutine)  # replaced by an async one: no longer sync
    assert not registry.is_sync("plain")


def _generator(session: Any, payload: dict[str, Any]) -> Any:
    yield 1


async def _async_generator(session: Any, payload: dict[str, Any]) -> Any:
    yield 1


def _hides_async(func: Any) -> Any:
    @functools.wraps(func)
    def wrapper(*args: Any) -> Any:
        return func(*args)
    return wrapper


@pytest.mark.parametrize(("func", "message"), [
    (_generator, "is a generator function"),
    (_async_generator, "is a generator function"),
    (Handlers(), "must be a function .* not Handlers"),
    (print, "must be a function .* not builtin_function_or_method"),
    ("send_email", "must be a function .* not str"),
    (_hides_async(coroutine), "wrapping an async one"),
])
def test_what_cannot_be_a_handler_is_refused_where_it_is_registered(
    func: Any, message: str
) -> None:
    registry = HandlerRegistry()
    with pytest.raises(TypeError, match=message):
        registry.add("t", func)
    assert "t" not in registry


@pytest.mark.parametrize("threads", [0, -1, True, 1.5, "4"])
def test_threads_must_be_a_whole_number_from_one(threads: Any) -> None:
    with pytest.raises(ValueError, match="threads must be a whole number, 1 or more"):
        WorkerConfig(threads=threads)
    assert WorkerConfig(threads=1).threads == 1


# -- in this process: what a sync job commits -----------------------------------------


def _effect(session: Any, job_id: Any) -> None:
    session.execute(text("INSERT INTO effects (job_id) VALUES (:id)"), {"id": job_id})


async def test_writes_commit_with_the_completion_and_roll_back_with_a_failure(
    engine: AsyncEngine, db_url: str, conn: asyncpg.Connection
) -> None:
    registry = HandlerRegistry()

    @registry.register("flaky")
    def flaky(session: Any, payload: dict[str, Any]) -> dict[str, Any]:
        job = current_job()  # inside the thread, the job it runs
        _effect(session, job.id)
        if job.attempt <= payload["fail_times"]:
            raise RuntimeError(f"attempt {job.attempt} fails")
        return {"job_id": str(job.id), "attempt": job.attempt}

    async with engine.begin() as s:
        ids = await enqueue_many(s, "flaky", [{"fail_times": n} for n in (0, 1, 2, 5)],
                                 max_retries=2)
    report = await drain(db_url, registry=registry, retry_policy=NOW)
    assert report["processed"] == 3 and report["failed"] == 1 and report["retried"] == 5

    rows = {r["id"]: r for r in await conn.fetch(
        "SELECT id, status, retry_count, result::text AS result, error_history, xmin::text "
        "FROM jobs")}
    effects = {r["job_id"]: r for r in await conn.fetch(
        "SELECT job_id, count(*) AS n, min(xmin::text) AS xmin FROM effects GROUP BY job_id")}
    for job_id, fail_times in zip(ids, (0, 1, 2, 5), strict=True):
        row = rows[job_id]
        attempts = min(fail_times, 3)
        assert [e["error"] for e in _history(row)] == [
            f"RuntimeError: attempt {n} fails" for n in range(1, attempts + 1)]
        if fail_times <= 2:
            assert row["status"] == "completed" and row["retry_count"] == fail_times
            assert json.loads(row["result"]) == {"job_id": str(job_id),
                                                 "attempt": fail_times + 1}
            # One write for all its attempts, by the very transaction that completed it.
            assert effects[job_id]["n"] == 1 and effects[job_id]["xmin"] == row["xmin"]
        else:
            assert row["status"] == "failed" and row["retry_count"] == 2
            assert job_id not in effects  # every attempt's write rolled back


def _history(row: asyncpg.Record) -> list[dict[str, Any]]:
    return json.loads(row["error_history"])


@pytest.mark.parametrize(("behaviour", "error"), [
    ("commit", "HandlerCommitError: handlers must not commit"),
    ("connection_commit", "HandlerCommitError: handlers must not commit"),
    ("swallow", "SwallowedDatabaseError"),
    ("open_nested", "HandlerError: the handler returned inside a begin_nested()"),
    ("awaitable", "TypeError: a sync handler returned an awaitable"),
    ("not_json", "TypeError: handler result is not JSON"),
])
async def test_a_sync_handler_that_breaks_the_rules_fails_and_writes_nothing(
    engine: AsyncEngine, db_url: str, conn: asyncpg.Connection, behaviour: str, error: str
) -> None:
    registry = HandlerRegistry()

    @registry.register("rude")
    def rude(session: Any, payload: dict[str, Any]) -> Any:
        _effect(session, current_job().id)
        if behaviour == "commit":
            session.commit()
        elif behaviour == "connection_commit":
            session.connection().commit()
        elif behaviour == "swallow":
            try:
                session.execute(text("SELECT 1 / 0"))
            except Exception:
                pass
        elif behaviour == "open_nested":
            session.begin_nested()
        elif behaviour == "awaitable":
            return coroutine(session, payload)
        return {1, 2} if behaviour == "not_json" else None

    async with engine.begin() as s:
        await enqueue_many(s, "rude", [{}], max_retries=0)
    await drain(db_url, registry=registry)
    row = await conn.fetchrow("SELECT status, error_message FROM jobs")
    assert row["status"] == "failed" and row["error_message"].startswith(error), row
    assert await conn.fetchval("SELECT count(*) FROM effects") == 0


async def test_a_savepoint_of_its_own_recovers_from_a_database_error(
    engine: AsyncEngine, db_url: str, conn: asyncpg.Connection
) -> None:
    await conn.execute("CREATE TABLE once (k int PRIMARY KEY); INSERT INTO once VALUES (1)")
    registry = HandlerRegistry()

    @registry.register("careful")
    def careful(session: Any, payload: dict[str, Any]) -> str:
        try:
            with session.begin_nested():
                session.execute(text("INSERT INTO once VALUES (1)"))
        except IntegrityError:
            pass  # rolled back to its savepoint: the transaction goes on
        _effect(session, current_job().id)
        return "kept"

    async with engine.begin() as s:
        await enqueue_many(s, "careful", [{}], max_retries=0)
    await drain(db_url, registry=registry)
    assert await conn.fetchval("SELECT status FROM jobs") == "completed"
    assert await conn.fetchval("SELECT count(*) FROM effects") == 1


async def test_a_limited_queue_limits_sync_jobs_too(
    engine: AsyncEngine, db_url: str, conn: asyncpg.Connection
) -> None:
    registry = HandlerRegistry()

    @registry.register("slow")
    def slow(session: Any, payload: dict[str, Any]) -> None:
        time.sleep(0.1)

    async with engine.begin() as s:
        await queues.limit(s, "narrow", concurrency=1)
        await enqueue_many(s, "slow", [{} for _ in range(4)], queue="narrow")
    await drain(db_url, registry=registry, threads=4)
    assert await conn.fetchval("SELECT count(*) FROM jobs WHERE status = 'completed'") == 4
    assert await _most_at_once(conn) == 1  # four threads free, one job at a time


async def _most_at_once(conn: asyncpg.Connection) -> int:
    """The most jobs running at once, from their own timestamps (claimed at
    started_at, recorded at completed_at)."""
    return await conn.fetchval(
        "SELECT max((SELECT count(*) FROM jobs AS o WHERE o.started_at <= j.started_at "
        "AND o.completed_at > j.started_at)) FROM jobs AS j")


async def _stuck_once(engine: AsyncEngine, db_url: str) -> tuple[uuid.UUID, JobRunner]:
    """A job whose first attempt writes, then sleeps in a statement for a
    minute, and whose retry writes and returns; and a runner for it."""
    registry = HandlerRegistry()

    @registry.register("stuck")
    def stuck(session: Any, payload: dict[str, Any]) -> None:
        _effect(session, current_job().id)
        if current_job().attempt == 1:
            session.execute(text("SELECT pg_sleep(60)"))

    async with engine.begin() as s:
        [job_id] = await enqueue_many(s, "stuck", [{}], max_retries=1)
    return job_id, JobRunner(db_url, registry=registry, install_signal_handlers=False,
                             retry_policy=NOW)


async def _stopped_once(conn: asyncpg.Connection, job_id: uuid.UUID, runner: JobRunner,
                        meanwhile: Callable[[], Awaitable[None]] | None = None) -> None:
    """Run `runner` (and `meanwhile` beside it) until the `_stuck_once` job's
    retry has completed; its first attempt must have been stopped, by an
    interrupt saying "took too long", and its writes undone."""
    task = asyncio.create_task(runner.run())
    try:
        if meanwhile is not None:
            await meanwhile()
        await wait_for(lambda: conn.fetchval(
            "SELECT status = 'completed' FROM jobs WHERE id = $1", job_id),
            timeout=TIMEOUT, message="the retry to complete")
    finally:
        runner.stop()
        await asyncio.wait_for(task, TIMEOUT)
    row = await conn.fetchrow("SELECT retry_count, error_history FROM jobs")
    assert row["retry_count"] == 1
    assert [e["error"] for e in _history(row)] == ["took too long"]
    assert await conn.fetchval("SELECT count(*) FROM effects") == 1  # the retry's only


async def test_interrupt_cancels_the_running_statement_and_fails_the_attempt(
    engine: AsyncEngine, db_url: str, conn: asyncpg.Connection
) -> None:
    job_id, runner = await _stuck_once(engine, db_url)

    async def interrupt() -> None:
        await wait_for(lambda: conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(60)' "
            "AND state = 'active' AND datname = current_database()"),
            timeout=TIMEOUT, message="the handler in its statement")
        assert not await runner.threads.interrupt(uuid.UUID(int=1), "nobody")
        assert await runner.threads.interrupt(job_id, "took too long")

    await _stopped_once(conn, job_id, runner, interrupt)


async def test_an_interrupt_that_reaches_the_server_before_the_statement_is_sent_again(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The handler's thread has let its statement through (no reason to stop
    yet), and the interrupt's first cancel reaches the server before the
    statement does: an idle backend drops it. Here the thread waits, just
    before it sends the statement, until that first cancel has been sent, so
    that they always come in that order; the statement must be cancelled all
    the same."""
    job_id, runner = await _stuck_once(engine, db_url)
    loop = asyncio.get_running_loop()
    cancels_sent = threading.Event()
    real_cancel = psycopg.Connection.cancel_safe

    def cancel_safe(self: psycopg.Connection[Any], *args: Any, **kw: Any) -> None:
        real_cancel(self, *args, **kw)
        cancels_sent.set()

    let_through = threads._before_statement

    def before_statement(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        let_through(conn, cursor, statement, *rest)
        if "pg_sleep" in statement and not cancels_sent.is_set():
            asyncio.run_coroutine_threadsafe(
                runner.threads.interrupt(job_id, "took too long"), loop)
            assert cancels_sent.wait(TIMEOUT), "the interrupt sent no cancel"

    monkeypatch.setattr(psycopg.Connection, "cancel_safe", cancel_safe)
    monkeypatch.setattr(threads, "_before_statement", before_statement)
    await _stopped_once(conn, job_id, runner)
    assert cancels_sent.is_set()


async def test_a_sync_job_obeys_its_timeout_a_cancel_and_a_snooze(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection) -> None:
    registry = HandlerRegistry()
    runs: list[str] = []

    @registry.register("sleepy")
    def sleepy(session: Any, payload: dict[str, Any]) -> str:
        runs.append(payload["name"])
        _effect(session, current_job().id)
        if payload["name"] == "snoozed" and runs.count("snoozed") == 1:
            raise Snooze(0.2)
        if payload["name"] != "snoozed":
            session.execute(text("SELECT pg_sleep(60)"))
        return "done"

    async with engine.begin() as s:
        timed = await enqueue(s, "sleepy", {"name": "timed"}, max_retries=0)
        cancelled = await enqueue(s, "sleepy", {"name": "cancelled"}, max_retries=3)
        snoozed = await enqueue(s, "sleepy", {"name": "snoozed"}, max_retries=0)
        await s.execute(text("UPDATE jobs SET timeout = 0.3 WHERE id = :id"), {"id": timed})
    runner = JobRunner(db_url, registry=registry, install_signal_handlers=False,
                       retry_policy=NOW, poll_interval=0.2)
    task = asyncio.create_task(runner.run())
    try:
        await wait_for(lambda: conn.fetchval(
            "SELECT status = 'processing' FROM jobs WHERE id = $1", cancelled),
            timeout=TIMEOUT, message="the job to cancel running")
        await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, f"{CANCEL_PREFIX}{cancelled}")
        await wait_for(lambda: conn.fetchval(
            "SELECT count(*) = 3 FROM jobs WHERE status IN ('completed', 'failed')"),
            timeout=TIMEOUT, message="every job ended")
    finally:
        runner.stop()
        await asyncio.wait_for(task, TIMEOUT)
    rows = {r["id"]: r for r in await conn.fetch("SELECT * FROM jobs")}
    assert rows[timed]["status"] == "failed"
    assert "timeout of 0.3 s" in rows[timed]["error_message"]
    assert (rows[cancelled]["status"], rows[cancelled]["error_message"],
            rows[cancelled]["retry_count"]) == ("failed", "cancelled", 0)
    assert (rows[snoozed]["status"], rows[snoozed]["retry_count"]) == ("completed", 0)
    assert runs.count("snoozed") == 2
    assert await conn.fetchval("SELECT count(*) FROM effects") == 1  # the snoozed job's second run


async def test_a_retry_recorded_while_the_lane_claimed_past_it_is_not_left_behind(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection) -> None:
    """A sync job's retry is due at its `fail` statement's time, and nothing
    announces it; the thread lane claims meanwhile, from a floor that its
    claims move on to their own time (`floors.py`). A claim whose snapshot
    began while the `fail` ran moves the floor past the retry. Here the
    `fail` waits on a row lock the test holds until such a claim is done:
    the retry must still run well before the worker's once-a-minute look
    from the front would find it."""
    registry = HandlerRegistry()
    ran: list[str] = []
    running, locked = threading.Event(), threading.Event()

    @registry.register("once")
    def once(session: Any, payload: dict[str, Any]) -> None:
        ran.append(payload["name"])
        if payload["name"] == "retried" and current_job().attempt == 1:
            running.set()
            assert locked.wait(TIMEOUT)
            raise RuntimeError("first attempt fails")

    async with engine.begin() as s:
        retried = await enqueue(s, "once", {"name": "retried"}, max_retries=1)
    runner = JobRunner(db_url, registry=registry, install_signal_handlers=False,
                       retry_policy=NOW, poll_interval=0.2, threads=2)
    task = asyncio.create_task(runner.run())
    holder = await asyncpg.connect(**db.asyncpg_connect_args(db_url))
    try:
        assert await asyncio.to_thread(running.wait, TIMEOUT)
        async with holder.transaction():
            await holder.execute("SELECT 1 FROM jobs WHERE id = $1 FOR SHARE", retried)
            locked.set()
            await wait_for(lambda: conn.fetchval(
                "SELECT count(*) = 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()"),
                timeout=TIMEOUT, message="the fail waiting for the row")
            async with engine.begin() as s:
                later = await enqueue(s, "once", {"name": "later"})
            await wait_for(lambda: conn.fetchval(
                "SELECT status = 'completed' FROM jobs WHERE id = $1", later),
                timeout=TIMEOUT, message="a claim past the retry")
        await wait_for(lambda: conn.fetchval(
            "SELECT status = 'completed' FROM jobs WHERE id = $1", retried),
            timeout=TIMEOUT, message="the retry to complete")
    finally:
        await holder.close()
        runner.stop()
        await asyncio.wait_for(task, TIMEOUT)
    assert ran == ["retried", "later", "retried"]


# -- real worker processes ---------------------------------------------------------


async def _events(conn: asyncpg.Connection, kind: str) -> int:
    return await conn.fetchval("SELECT count(*) FROM events WHERE kind = $1", kind)


async def test_a_blocking_sync_handler_stalls_neither_async_jobs_nor_the_heartbeat(
    engine: AsyncEngine, spawn_worker, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    worker: WorkerProcess = spawn_worker("--lease", "1", handlers="tests.sync_handlers")
    await wait_for(lambda: in_state(conn, worker, "active"), timeout=TIMEOUT,
                   message="the worker to be active")
    # A standby fences the active worker once its heartbeat is a lease old.
    standby: WorkerProcess = spawn_worker("--lease", "1", handlers="tests.sync_handlers")
    await wait_for(lambda: in_state(conn, standby, "standby"), timeout=TIMEOUT,
                   message="a standby")
    async with engine.begin() as s:
        [blocked] = await enqueue_many(s, "sync_effect", [{"gate": str(gate)}])
    await wait_for(lambda: _events(conn, "started"), timeout=TIMEOUT,
                   message="the sync handler to start blocking")
    me = await worker_state(conn, worker)
    assert me is not None
    # Claimed, not taken: it shows `processing` with the worker's id while it runs.
    assert await conn.fetchval("SELECT status || ' ' || worker_id FROM jobs WHERE id = $1",
                               blocked) == f"processing {me['id']}"

    # Three leases go by; meanwhile async jobs keep flowing in the same worker.
    for _ in range(3):
        async with engine.begin() as s:
            await enqueue_many(s, "noop", [{} for _ in range(20)])
    await wait_for(lambda: conn.fetchval(
        "SELECT count(*) = 60 FROM jobs WHERE job_type = 'noop' AND status = 'completed'"),
        timeout=TIMEOUT, message="the async jobs to complete")
    await wait_for(lambda: conn.fetchval(
        "SELECT now() - started_at > interval '3 seconds' FROM jobs WHERE id = $1", blocked),
        timeout=TIMEOUT, message="three leases of blocking")
    assert await conn.fetchval("SELECT status FROM jobs WHERE id = $1", blocked) == "processing"
    assert await conn.fetchval(  # the async jobs ran while the sync one blocked
        "SELECT count(*) FROM jobs WHERE job_type = 'noop' AND completed_at > "
        "(SELECT started_at FROM jobs WHERE id = $1)", blocked) == 60

    gate.touch()
    await wait_for(lambda: conn.fetchval(
        "SELECT status = 'completed' FROM jobs WHERE id = $1", blocked),
        timeout=TIMEOUT, message="the sync job to complete")
    # Never fenced: the same life (worker id) did everything, the standby stood by.
    again = await worker_state(conn, worker)
    assert again is not None and again["id"] == me["id"] and again["state"] == "active"
    assert await in_state(conn, standby, "standby")
    assert await conn.fetchval("SELECT count(DISTINCT worker_id) FROM jobs") == 1
    assert "fenced" not in worker.log() + standby.log()
    assert await conn.fetchval("SELECT count(*) FROM effects") == 1
    await worker.stop()
    await standby.stop()


async def test_never_more_sync_handlers_at_once_than_threads(
    engine: AsyncEngine, spawn_worker, conn: asyncpg.Connection
) -> None:
    worker = spawn_worker("--threads", "2", handlers="tests.sync_handlers")
    async with engine.begin() as s:
        await enqueue_many(s, "sync_effect", [{"sleep": 0.3} for _ in range(8)])
    await wait_for(lambda: conn.fetchval(
        "SELECT count(*) = 8 FROM jobs WHERE status = 'completed'"),
        timeout=TIMEOUT, message="every sync job completed")
    assert await _most_at_once(conn) == 2  # side by side, never three
    threads = await conn.fetchval("SELECT count(DISTINCT result ->> 'thread') FROM jobs")
    assert threads == 2
    await worker.stop()


async def test_sigterm_lets_a_running_sync_handler_finish(
    engine: AsyncEngine, spawn_worker, conn: asyncpg.Connection, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    worker = spawn_worker("--grace-period", "60", handlers="tests.sync_handlers")
    async with engine.begin() as s:
        [job_id] = await enqueue_many(s, "sync_effect", [{"gate": str(gate)}])
    await wait_for(lambda: _events(conn, "started"), timeout=TIMEOUT,
                   message="the sync handler to start")
    worker.signal(signal.SIGTERM)
    await wait_for(lambda: "stop requested" in worker.log(), timeout=TIMEOUT,
                   message="the signal to be seen")
    assert worker.proc.poll() is None  # still waiting for the handler
    gate.touch()
    assert await worker.wait(TIMEOUT) == 0, worker.log()
    assert await conn.fetchval("SELECT status FROM jobs WHERE id = $1", job_id) == "completed"
    assert await conn.fetchval("SELECT count(*) FROM effects") == 1


async def test_sigterm_past_the_grace_period_cuts_the_sync_handler_off(
    engine: AsyncEngine, spawn_worker, conn: asyncpg.Connection
) -> None:
    worker = spawn_worker("--grace-period", "0.5", handlers="tests.sync_handlers")
    async with engine.begin() as s:
        [job_id] = await enqueue_many(s, "sync_effect", [{"sleep": 300}])
    await wait_for(lambda: _events(conn, "started"), timeout=TIMEOUT,
                   message="the sync handler to start")
    worker.signal(signal.SIGTERM)
    # It exits without waiting for the thread, which cannot be stopped.
    assert await worker.wait(TIMEOUT) == 0, worker.log()
    row = await conn.fetchrow("SELECT status, retry_count, worker_id, error_history::text AS h "
                              "FROM jobs WHERE id = $1", job_id)
    assert dict(row) == {"status": "pending", "retry_count": 0, "worker_id": None, "h": "[]"}
    assert await conn.fetchval("SELECT count(*) FROM effects") == 0  # its write rolled back
    assert await _events(conn, "finished") == 0
    await wait_for(lambda: conn.fetchval(
        "SELECT count(*) = 0 FROM pg_stat_activity WHERE application_name LIKE "
        "'jobqueue worker %' AND datname = current_database()"),
        timeout=TIMEOUT, message="the worker's connections gone")


def test_the_threads_reach_the_same_database_through_psycopg() -> None:
    assert db.sync_url("postgresql+asyncpg://u@/jq?host=/tmp/run") == \
        "postgresql+psycopg://u@/jq?host=%2Ftmp%2Frun"  # a unix socket folder
    assert db.sync_url("postgresql://u:pw@h:5433/jq?ssl=require&target_session_attrs=read-write"
                       ) == "postgresql+psycopg://u:pw@h:5433/jq?sslmode=require&" \
                            "target_session_attrs=read-write"
