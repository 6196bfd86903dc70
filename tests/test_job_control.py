"""Stopping one job and nothing else: timeouts, cancels of running jobs, snoozes.

The worker runs in this process, so a handler can say when it has started
(an asyncio.Event) and the test knows which run it stops. Every stopped job's
writes must be gone and its batch-mates' kept, on a lane connection that is
still the same (no job of the batch was handed back, the worker never
started over)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from jobqueue import HandlerRegistry, JobRunner, RetryPolicy, control, enqueue, enqueue_many
from jobqueue.schema.locks import CANCEL_PREFIX, CHANNEL
from jobqueue.testing import wait_for
from jobqueue.worker import batch
from jobqueue.worker.handler import Snooze

FAST_RETRIES = RetryPolicy(base=0.05, factor=2.0, cap=1.0, jitter=0.0)


class Handlers:
    """A registry whose jobs write a row each (`marks`), and say when the
    slow ones start."""

    def __init__(self) -> None:
        self.registry = HandlerRegistry()
        self.started: dict[str, asyncio.Event] = {}
        self.calls: list[str] = []
        r = self.registry

        @r.register("write")
        async def write(session: Any, payload: dict[str, Any]) -> None:
            self.calls.append(payload["n"])
            await session.execute(text("INSERT INTO marks VALUES (:n)"), {"n": payload["n"]})

        @r.register("slow")
        async def slow(session: Any, payload: dict[str, Any]) -> None:
            """Writes, then waits: on the event loop, or in a statement."""
            self.calls.append(payload["n"])
            await session.execute(text("INSERT INTO marks VALUES (:n)"), {"n": payload["n"]})
            self.started.setdefault(payload["n"], asyncio.Event()).set()
            if payload.get("in_sql"):
                await session.execute(text("SELECT pg_sleep(60)"))
            elif payload.get("swallow"):
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(60)
            else:
                await asyncio.sleep(60)

        @r.register("blocking")
        async def blocking(session: Any, payload: dict[str, Any]) -> str:
            time.sleep(payload["seconds"])  # blocks the event loop: nothing can stop it
            return "returned"

        @r.register("snoozy")
        async def snoozy(session: Any, payload: dict[str, Any]) -> str:
            self.calls.append(payload["n"])
            await session.execute(text("INSERT INTO marks VALUES (:n)"), {"n": payload["n"]})
            if self.calls.count(payload["n"]) == 1:
                raise Snooze(payload["seconds"])
            return "done"

    async def wait_started(self, n: str) -> None:
        await asyncio.wait_for(self.started.setdefault(n, asyncio.Event()).wait(), 30)


@contextlib.asynccontextmanager
async def running(db_url: str, handlers: Handlers, **kw: Any) -> AsyncIterator[JobRunner]:
    kw.setdefault("poll_interval", 0.2)
    runner = JobRunner(db_url, registry=handlers.registry, install_signal_handlers=False,
                       retry_policy=FAST_RETRIES, **kw)
    task = asyncio.create_task(runner.run())
    try:
        yield runner
    finally:
        runner.stop()
        report = await asyncio.wait_for(asyncio.shield(task), 30)
    assert report["handed_back"] == 0  # no batch went back: the lane carried on


async def _prepare(conn: asyncpg.Connection) -> None:
    await conn.execute("CREATE TABLE marks (n text)")


async def _effects(conn: asyncpg.Connection) -> list[str]:
    return sorted(r["n"] for r in await conn.fetch("SELECT n FROM marks"))


async def _job(conn: asyncpg.Connection, job_id: uuid.UUID) -> asyncpg.Record:
    row = await conn.fetchrow("SELECT * FROM jobs WHERE id = $1", job_id)
    assert row is not None
    return row


async def _finished(conn: asyncpg.Connection, n: int) -> bool:
    return await conn.fetchval(
        "SELECT count(*) FROM jobs WHERE status IN ('completed', 'failed')") == n


async def _batch(engine: AsyncEngine, slow: dict[str, Any], timeout: float | None = None
                 ) -> uuid.UUID:
    """Three writes, the slow job, three writes: one claimed batch of seven
    (quick_batch=0), the slow job in the middle."""
    async with engine.begin() as s:
        await enqueue_many(s, "write", [{"n": f"a{i}"} for i in range(3)])
        slow_id = await enqueue(s, "slow", {"n": "slow", **slow}, max_retries=0)
        await enqueue_many(s, "write", [{"n": f"b{i}"} for i in range(3)])
        await s.execute(text(  # due in the order they were enqueued
            "UPDATE jobs SET run_at = now() - interval '1 s' * "
            "(SELECT count(*) FROM jobs AS o WHERE o.created_at > jobs.created_at)"))
        if timeout is not None:
            await s.execute(text("UPDATE jobs SET timeout = :t WHERE id = :id"),
                            {"t": timeout, "id": slow_id})
    return slow_id


async def _assert_alone_stopped(conn: asyncpg.Connection, slow_id: uuid.UUID, error: str,
                                workers: int = 1) -> None:
    row = await _job(conn, slow_id)
    assert row["status"] == "failed" and error in row["error_message"]
    assert await _effects(conn) == ["a0", "a1", "a2", "b0", "b1", "b2"]  # its own write is gone
    assert await conn.fetchval("SELECT count(*) FROM jobs WHERE status = 'completed'") == 6
    assert await conn.fetchval("SELECT count(DISTINCT worker_id) FROM jobs") == workers


async def test_a_timeout_stops_a_handler_waiting_on_the_event_loop(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection) -> None:
    await _prepare(conn)
    slow_id = await _batch(engine, {}, timeout=0.3)
    handlers = Handlers()
    async with running(db_url, handlers, quick_batch=0, concurrency=1):
        await wait_for(lambda: _finished(conn, 7), timeout=30, message="seven jobs finished")
    assert handlers.started["slow"].is_set()  # it did start, and was stopped
    await _assert_alone_stopped(conn, slow_id, "timeout of 0.3 s")


async def test_a_timeout_stops_a_handler_inside_a_statement_and_the_lane_carries_on(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection) -> None:
    await _prepare(conn)
    slow_id = await _batch(engine, {"in_sql": True}, timeout=0.3)
    handlers = Handlers()
    async with running(db_url, handlers, quick_batch=0, concurrency=1):
        await wait_for(lambda: _finished(conn, 7), timeout=30, message="seven jobs finished")
    assert handlers.started["slow"].is_set()
    await _assert_alone_stopped(conn, slow_id, "timeout of 0.3 s")
    # The pg_sleep(60) really was cut short: nothing of this test's runs now.
    assert await conn.fetchval("SELECT count(*) FROM pg_stat_activity "
                               "WHERE query LIKE 'SELECT pg_sleep(60)%' "
                               "AND datname = current_database()") == 0


async def test_a_handler_that_swallows_its_stop_still_fails(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection) -> None:
    await _prepare(conn)
    slow_id = await _batch(engine, {"swallow": True}, timeout=0.3)
    async with running(db_url, Handlers(), quick_batch=0, concurrency=1):
        await wait_for(lambda: _finished(conn, 7), timeout=30, message="seven jobs finished")
    await _assert_alone_stopped(conn, slow_id, "timeout of 0.3 s")


async def test_a_timed_out_attempt_is_retried_like_any_failure(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection) -> None:
    await _prepare(conn)
    async with engine.begin() as s:
        slow_id = await enqueue(s, "slow", {"n": "slow"}, max_retries=1)
        await s.execute(text("UPDATE jobs SET timeout = 0.2"))
    async with running(db_url, Handlers()):
        await wait_for(lambda: _finished(conn, 1), timeout=30, message="the job failed")
    row = await _job(conn, slow_id)
    assert row["retry_count"] == 1 and row["status"] == "failed"
    assert row["error_history"].count("timeout of 0.2 s") == 2  # both attempts timed out


async def test_a_handler_that_blocks_the_loop_past_its_timeout_fails_when_it_returns(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection) -> None:
    async with engine.begin() as s:
        job_id = await enqueue(s, "blocking", {"seconds": 0.6}, max_retries=0)
        await s.execute(text("UPDATE jobs SET timeout = 0.2"))
    async with running(db_url, Handlers()):
        await wait_for(lambda: _finished(conn, 1), timeout=30, message="the job ended")
    row = await _job(conn, job_id)
    assert row["status"] == "failed" and "timeout of 0.2 s" in row["error_message"]
    assert row["result"] is None  # what it returned was not kept


async def _cancel(conn: asyncpg.Connection, job_id: uuid.UUID) -> None:
    await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, f"{CANCEL_PREFIX}{job_id}")


async def test_cancelling_a_claimed_running_job_stops_it_and_spares_its_batch(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection) -> None:
    await _prepare(conn)
    slow_id = await _batch(engine, {"in_sql": True})
    handlers = Handlers()
    async with running(db_url, handlers, quick_batch=0, concurrency=1):
        await handlers.wait_started("slow")
        assert (await _job(conn, slow_id))["status"] == "processing"
        await _cancel(conn, slow_id)
        await wait_for(lambda: _finished(conn, 7), timeout=30, message="seven jobs finished")
    await _assert_alone_stopped(conn, slow_id, "cancelled")
    row = await _job(conn, slow_id)
    assert row["error_message"] == "cancelled" and row["retry_count"] == 0


async def test_cancelling_jobs_of_a_quick_batch_running_and_waiting(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection) -> None:
    await _prepare(conn)
    handlers = Handlers()
    # A quick batch takes jobs that run under 10 s by the lane's pace: one
    # write first teaches it that writes are fast.
    async with running(db_url, handlers, quick_batch=10.0, concurrency=1) as runner:
        async with engine.begin() as s:
            await enqueue(s, "write", {"n": "first"})
        await wait_for(lambda: _finished(conn, 1), timeout=30, message="the first write")
        assert runner.stats.batches == 1
        slow_id = await _batch(engine, {})
        waiting_id = await conn.fetchval("SELECT id FROM jobs WHERE payload->>'n' = 'b0'")
        await handlers.wait_started("slow")
        assert (await _job(conn, slow_id))["status"] == "pending"  # taken: locked, not claimed
        await _cancel(conn, waiting_id)  # not started yet: it will not run
        await _cancel(conn, slow_id)
        await wait_for(lambda: _finished(conn, 8), timeout=30, message="eight jobs finished")
    assert "b0" not in handlers.calls
    assert (await _job(conn, waiting_id))["error_message"] == "cancelled"
    assert (await _job(conn, slow_id))["error_message"] == "cancelled"
    assert await _effects(conn) == ["a0", "a1", "a2", "b1", "b2", "first"]
    assert await conn.fetchval("SELECT count(*) FROM jobs WHERE status = 'completed'") == 6


@pytest.mark.parametrize("how", ["claimed", "taken", "sync"])
async def test_a_cancel_heard_before_the_claims_reply_stops_the_job_unstarted(
        how: str, engine: AsyncEngine, db_url: str, conn: asyncpg.Connection,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The cancel's notification can reach the worker before its lane has
    the claim's reply in hand (the job was `processing`, or locked by the
    quick batch, so `cancel` asked the workers): the event loop runs the
    notification first. Here the claim waits, once its reply is in, until
    the worker has heard the cancel, so that it always comes in that order."""
    await _prepare(conn)
    handlers = Handlers()
    ran: list[str] = []

    @handlers.registry.register("noted_sync")
    def noted_sync(session: Any, payload: dict[str, Any]) -> None:
        ran.append(payload["n"])

    target: list[uuid.UUID] = []
    heard = asyncio.Event()

    async def cancel_first(rows: list[Any]) -> None:
        if target and not heard.is_set() and any(row[0] == target[0] for row in rows):
            async with engine.begin() as s:
                outcome = await control.cancel(s, target[0])
            assert not outcome.cancelled  # a worker holds it: the workers were asked
            await asyncio.wait_for(heard.wait(), 30)

    if how == "taken":
        original_lock = batch.lock

        async def lock(raw: Any, query: str, **values: Any) -> Any:
            locked = await original_lock(raw, query, **values)
            await cancel_first(locked[1] if locked else [])
            return locked

        monkeypatch.setattr(batch, "lock", lock)
    else:
        original_claimed = batch.Claimed.claimed

        async def claimed(self: Any, *args: Any) -> list[Any]:
            rows = await original_claimed(self, *args)
            await cancel_first(rows)
            return rows

        monkeypatch.setattr(batch.Claimed, "claimed", claimed)
    async with running(db_url, handlers, quick_batch=10.0, concurrency=1) as runner:
        heard_by_worker = runner.cancel

        def cancel(job_id: uuid.UUID) -> bool:
            held = heard_by_worker(job_id)
            heard.set()
            return held

        runner.cancel = cancel  # type: ignore[method-assign]
        job_type = "noted_sync" if how == "sync" else "write"
        async with engine.begin() as s:
            if how == "taken":
                # A lane's first job is claimed (it teaches the lane the pace),
                # and the next one is taken only if that claim saw it due.
                await enqueue(s, "write", {"n": "first"})
            target.append(await enqueue(s, job_type, {"n": "cancelled"}, max_retries=3))
        await wait_for(lambda: conn.fetchval(
            "SELECT status = 'failed' FROM jobs WHERE id = $1", target[0]),
            timeout=30, message="the job failed")
    assert heard.is_set()
    row = await _job(conn, target[0])
    assert (row["error_message"], row["retry_count"]) == ("cancelled", 0)
    assert "cancelled" not in handlers.calls + ran  # never started


async def test_a_cancel_for_a_job_this_worker_does_not_hold_changes_nothing(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection) -> None:
    await _prepare(conn)
    handlers = Handlers()
    async with running(db_url, handlers) as runner:
        await _cancel(conn, uuid.uuid4())
        await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, f"{CANCEL_PREFIX}not-a-uuid")
        async with engine.begin() as s:
            await enqueue(s, "write", {"n": "x"})
        await wait_for(lambda: _finished(conn, 1), timeout=30, message="the write")
        assert runner.stats.completed == 1
    assert await _effects(conn) == ["x"]


async def test_a_snoozed_job_runs_again_later_without_using_an_attempt(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection) -> None:
    await _prepare(conn)
    async with engine.begin() as s:
        snoozed = await enqueue(s, "snoozy", {"n": "s", "seconds": 0.5}, max_retries=0)
        await enqueue_many(s, "write", [{"n": f"w{i}"} for i in range(3)])
    handlers = Handlers()
    async with running(db_url, handlers, quick_batch=0) as runner:
        await wait_for(lambda: _finished(conn, 4), timeout=30, message="four jobs finished")
        assert runner.stats.snoozed == 1
    row = await _job(conn, snoozed)
    assert row["status"] == "completed" and row["retry_count"] == 0
    assert row["error_history"] == "[]"
    assert handlers.calls.count("s") == 2
    assert await _effects(conn) == ["s", "w0", "w1", "w2"]  # the snoozed run's write rolled back
    first_run = await conn.fetchval("SELECT min(completed_at) FROM jobs WHERE job_type = 'write'")
    assert (row["started_at"] - first_run).total_seconds() >= 0.4  # due again after its snooze


async def test_a_bad_snooze_is_the_attempts_failure() -> None:
    for bad in (-1, float("nan"), True, "5"):
        try:
            Snooze(bad)  # type: ignore[arg-type]
        except ValueError as e:
            assert "Snooze takes seconds" in str(e)
        else:
            raise AssertionError(f"Snooze({bad!r}) was accepted")


async def test_a_types_default_timeout_applies_and_a_jobs_own_wins(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection) -> None:
    handlers = Handlers()

    @handlers.registry.register("lingering", timeout=0.3)
    async def lingering(session: Any, payload: dict[str, Any]) -> str:
        await asyncio.sleep(payload["seconds"])
        return "done"

    async with engine.begin() as s:
        by_type = await enqueue(s, "lingering", {"seconds": 30}, max_retries=0)
        own = await enqueue(s, "lingering", {"seconds": 0.6}, max_retries=0, timeout=5)
    async with running(db_url, handlers):
        await wait_for(lambda: _finished(conn, 2), timeout=30, message="both ended")
    assert "timeout of 0.3 s" in (await _job(conn, by_type))["error_message"]
    assert (await _job(conn, own))["status"] == "completed"  # its own 5 s, not the type's 0.3


@pytest.mark.parametrize("quick_batch", [None, 0], ids=["quick batch", "claimed"])
async def test_a_job_cancelled_retried_and_completed_shows_no_error(
        db_url: str, engine: AsyncEngine, conn: asyncpg.Connection,
        quick_batch: int | None) -> None:
    """Issue 31, item 8: it still said `cancelled`, completed. Both ways a
    job completes (a quick batch's `complete_taken`, a claim's `complete`)."""
    from jobqueue.ops import actions
    from jobqueue.testing import drain

    registry = HandlerRegistry()

    @registry.register("ok")
    async def ok(session: Any, payload: dict[str, Any]) -> str:
        return "done"

    async with engine.begin() as s:
        job_id = await enqueue(s, "ok", {})
    async with engine.connect() as c:
        assert await actions.cancel(c, job_id, None, wait=1.0)
    row = await _job(conn, job_id)
    assert (row["status"], row["error_message"]) == ("failed", "cancelled")  # something to clear
    async with engine.connect() as c:
        await actions.retry(c, job_id)
    options = {} if quick_batch is None else {"quick_batch": quick_batch}
    await drain(db_url, registry=registry, **options)
    row = await _job(conn, job_id)
    assert row["status"] == "completed" and row["result"] == '"done"'
    assert row["error_message"] is None
