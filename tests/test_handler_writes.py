"""What handlers write: once, with their job's completion, and never for a failed job.

A batch runs its jobs plain (no savepoint) until a job type fails after
writing; that failure rolls the batch back and runs it again with a savepoint
per job, and the type keeps its savepoints from then on (`savepoints="auto"`).
With `savepoints="always"` every job that touches the database has one.
Either way: each successful job's writes commit exactly once, a failed job's
writes never, and no transaction opens more savepoints than PostgreSQL can
track without overflowing its subtransaction cache (64).
"""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from jobqueue import HandlerRegistry, JobRunner, current_job, enqueue
from jobqueue.handler_session import SAVEPOINT_LIMIT


def writers(runs: Counter[uuid.UUID]) -> HandlerRegistry:
    """Handlers that write one `effects` row each, and count their runs."""
    registry = HandlerRegistry()

    async def write(session: AsyncSession, n: int = 1) -> None:
        await session.execute(text("INSERT INTO effects (job_id, n) VALUES (:id, :n)"),
                              {"id": current_job().id, "n": n})

    @registry.register("ok")
    async def ok(session: AsyncSession, payload: dict[str, Any]) -> dict[str, bool]:
        runs[current_job().id] += 1
        await write(session)
        return {"ok": True}

    @registry.register("write_then_fail")
    async def write_then_fail(session: AsyncSession, payload: dict[str, Any]) -> None:
        runs[current_job().id] += 1
        await write(session)
        raise RuntimeError("failed after writing")

    @registry.register("fail_before_write")
    async def fail_before_write(session: AsyncSession, payload: dict[str, Any]) -> None:
        runs[current_job().id] += 1
        raise RuntimeError("failed before writing")

    @registry.register("db_error")
    async def db_error(session: AsyncSession, payload: dict[str, Any]) -> None:
        runs[current_job().id] += 1
        await write(session)
        await write(session, n=-1)  # breaks the CHECK below: the statement fails

    @registry.register("swallow")
    async def swallow(session: AsyncSession, payload: dict[str, Any]) -> None:
        runs[current_job().id] += 1
        await write(session)
        try:
            await write(session, n=-1)
        except Exception:  # noqa: BLE001 - what this handler is about
            return None

    @registry.register("rollback_then_ok")
    async def rollback_then_ok(session: AsyncSession, payload: dict[str, Any]) -> None:
        """Undoes its first write itself, then writes again: only n=2 may stay."""
        runs[current_job().id] += 1
        await write(session)
        await session.rollback()
        await write(session, n=2)

    return registry


async def enqueue_in_order(engine: AsyncEngine, types: list[str]) -> list[uuid.UUID]:
    """One job per type, due one microsecond apart in this order (so a batch
    takes them in it), all due already."""
    start = datetime.now(UTC) - timedelta(minutes=1)
    async with engine.begin() as s:
        return [await enqueue(s, job_type, {}, max_retries=0,
                              run_at=start + timedelta(microseconds=i))
                for i, job_type in enumerate(types)]


async def run(db_url: str, registry: HandlerRegistry, **options: Any
              ) -> tuple[JobRunner, dict[str, Any]]:
    """Drain with one lane whose batches may last 5 s (so they are as large as
    the test makes them, in the order it enqueued them); the runner (what it
    learnt) and its report."""
    runner = JobRunner(db_url, registry=registry, burst=True, install_signal_handlers=False,
                       quick_batch=5.0, concurrency=1, **options)
    return runner, await runner.run()


@pytest.fixture
async def checked_effects(conn: asyncpg.Connection) -> None:
    await conn.execute("ALTER TABLE effects ADD CHECK (n > 0)")


@pytest.mark.parametrize("savepoints", ["auto", "always"])
async def test_in_a_mixed_batch_each_success_writes_once_and_each_failure_nothing(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection, checked_effects: None,
        savepoints: str) -> None:
    kinds = ["ok", "write_then_fail", "ok", "fail_before_write", "ok", "db_error", "ok",
             "swallow", "ok", "rollback_then_ok", "ok"]
    types = ["ok"] + kinds * 6  # the first job runs alone, claimed; the rest in one batch
    ids = await enqueue_in_order(engine, types)
    runs: Counter[uuid.UUID] = Counter()
    runner, report = await run(db_url, writers(runs), savepoints=savepoints)
    assert report["processed"] == types.count("ok") + types.count("rollback_then_ok")
    assert report["batches"] >= 2 and report["batches"] < len(types) / 4  # batches, not jobs

    rows = await conn.fetch("SELECT job_id, n FROM effects")
    written = Counter(r["job_id"] for r in rows)
    for job_id, job_type in zip(ids, types, strict=True):
        if job_type == "ok":
            assert written[job_id] == 1, "a successful job's write commits exactly once"
        elif job_type == "rollback_then_ok":
            assert [r["n"] for r in rows if r["job_id"] == job_id] == [2]
        else:
            assert written[job_id] == 0, f"{job_type}: a failed job writes nothing"
    status = {r["id"]: (r["status"], r["attempts"]) for r in await conn.fetch(
        "SELECT id, status, jsonb_array_length(error_history) AS attempts FROM jobs")}
    for job_id, job_type in zip(ids, types, strict=True):
        expected = "completed" if job_type in ("ok", "rollback_then_ok") else "failed"
        assert status[job_id] == (expected, 0 if expected == "completed" else 1), job_type
    # Every failed attempt ran once and was recorded once; the batch-mates of a
    # type's first failure may have run twice, and the report says how many.
    extra = sum(n - 1 for n in runs.values())
    assert extra == report["rerun"]
    assert all(runs[i] == 1 for i, t in zip(ids, types, strict=True) if t != "ok")
    if savepoints == "always":
        assert report["rerun"] == 0 and runner.isolated_types == set()
    else:
        # The first failure after writing (job 2) reruns the batch once, every
        # job in a savepoint: the other failing types then fail alone, and
        # only the first one's type has learnt to keep its savepoints.
        assert report["rerun"] == 1
        assert runner.isolated_types == {"write_then_fail"}


async def test_a_type_reruns_its_batch_once_then_keeps_its_savepoints(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection,
        caplog: pytest.LogCaptureFixture) -> None:
    types = ["ok"] * 10 + ["write_then_fail"] + ["ok"] * 10 + ["write_then_fail"] + ["ok"] * 10
    ids = await enqueue_in_order(engine, types)
    runs: Counter[uuid.UUID] = Counter()
    caplog.set_level("WARNING", logger="jobqueue.worker")
    runner, report = await run(db_url, writers(runs))
    # Job 0 runs alone (claimed, to learn the pace); jobs 1-9 run plain, job 10
    # fails after writing: the batch rolls back, jobs 1-9 run again, and from
    # then on write_then_fail runs in a savepoint: job 21 fails alone.
    assert report["rerun"] == 9
    assert [runs[i] for i in ids[1:10]] == [2] * 9
    assert all(runs[i] == 1 for i in ids[10:] + ids[:1])
    assert runner.isolated_types == {"write_then_fail"}
    reruns = [r for r in caplog.records if getattr(r, "event", None) == "batch_rerun"]
    assert len(reruns) == 1 and reruns[0].job_id == str(ids[10])  # type: ignore[attr-defined]
    assert await conn.fetchval("SELECT count(*) FROM effects") == types.count("ok")
    assert await conn.fetchval("SELECT count(DISTINCT job_id) FROM effects") == types.count("ok")


async def test_a_plain_job_that_fails_before_writing_reruns_nothing(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection) -> None:
    types = ["ok"] * 5 + ["fail_before_write"] * 3 + ["ok"] * 5
    await enqueue_in_order(engine, types)
    runs: Counter[uuid.UUID] = Counter()
    runner, report = await run(db_url, writers(runs))
    assert report["rerun"] == 0
    assert set(runs.values()) == {1} and runner.isolated_types == set()
    assert await conn.fetchval("SELECT count(*) FROM effects") == 10


# -- the subtransaction cache -------------------------------------------------------

SUBXACT = """SELECT s.subxact_count, s.subxact_overflowed
             FROM pg_stat_get_backend_idset() AS b(id)
             CROSS JOIN LATERAL pg_stat_get_backend_subxact(b.id) AS s
             WHERE pg_stat_get_backend_pid(b.id) = $1"""


def probing(probe: asyncpg.Connection, seen: list[tuple[int, bool]],
            nested: int = 0) -> HandlerRegistry:
    """`write` jobs write a row (and `nested` more, each in a savepoint of the
    handler's own), then ask, from another connection, how many
    subtransactions their lane's backend holds and whether its cache overflowed."""
    registry = HandlerRegistry()

    @registry.register("write")
    async def write(session: AsyncSession, payload: dict[str, Any]) -> None:
        insert = text("INSERT INTO effects (job_id) VALUES (:id)")
        await session.execute(insert, {"id": current_job().id})
        for _ in range(nested):
            async with session.begin_nested():
                await session.execute(insert, {"id": current_job().id})
        lane = await (await session.connection()).get_raw_connection()
        row = await probe.fetchrow(SUBXACT, lane.driver_connection.get_server_pid())
        seen.append((row["subxact_count"], row["subxact_overflowed"]))

    return registry


async def enqueue_writes(engine: AsyncEngine, n: int) -> None:
    await enqueue_in_order(engine, ["write"] * n)


async def test_isolated_batches_stay_within_the_subtransaction_cache(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection) -> None:
    await enqueue_writes(engine, 200)
    seen: list[tuple[int, bool]] = []
    _, report = await run(db_url, probing(conn, seen), savepoints="always")
    assert report["processed"] == 200
    counts = [count for count, _ in seen]
    assert max(counts) <= SAVEPOINT_LIMIT and not any(over for _, over in seen)
    # Something to check: batches did fill up to the limit (one savepoint a job).
    assert max(counts) >= SAVEPOINT_LIMIT - 1
    assert report["batches"] >= 200 / SAVEPOINT_LIMIT


async def test_plain_batches_open_no_subtransaction_and_grow_past_64(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection) -> None:
    await enqueue_writes(engine, 200)
    seen: list[tuple[int, bool]] = []
    _, report = await run(db_url, probing(conn, seen))
    assert report["processed"] == 200
    assert {count for count, _ in seen} == {0}
    assert report["batches"] <= 3  # the first job alone, then 199 in one or two batches


async def test_the_probe_sees_an_overflow_when_one_happens(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection) -> None:
    """The check above could not pass by accident: a handler that opens 70
    savepoints of its own overflows the cache, and the probe says so."""
    await enqueue_writes(engine, 2)
    seen: list[tuple[int, bool]] = []
    await run(db_url, probing(conn, seen, nested=SAVEPOINT_LIMIT + 6))
    assert seen and all(over for _, over in seen)


@pytest.mark.parametrize("savepoints", ["auto", "always"])
async def test_a_handlers_own_savepoint_rolls_back_its_part_only(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection, savepoints: str) -> None:
    registry = HandlerRegistry()

    @registry.register("nested")
    async def nested(session: AsyncSession, payload: dict[str, Any]) -> None:
        insert = text("INSERT INTO effects (job_id, n) VALUES (:id, :n)")
        await session.execute(insert, {"id": current_job().id, "n": 1})
        try:
            async with session.begin_nested():
                await session.execute(insert, {"id": current_job().id, "n": 2})
                raise ValueError("undo n=2 only")
        except ValueError:
            pass
        async with session.begin_nested():
            await session.execute(insert, {"id": current_job().id, "n": 3})

    ids = await enqueue_in_order(engine, ["nested"] * 5)
    _, report = await run(db_url, registry, savepoints=savepoints)
    assert report["processed"] == 5 and report["rerun"] == 0
    rows = await conn.fetch("SELECT job_id, n FROM effects ORDER BY job_id, n")
    assert sorted((r["job_id"], r["n"]) for r in rows) == sorted(
        (i, n) for i in ids for n in (1, 3))
