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
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from jobqueue import HandlerRegistry, JobRunner, current_job, enqueue
from jobqueue.testing import drain as drain_all
from jobqueue.worker.pacing import SAVEPOINT_LIMIT


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

    @registry.register("noop")
    async def noop(session: AsyncSession, payload: dict[str, Any]) -> None:
        runs[current_job().id] += 1

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
                       **{"quick_batch": 5.0, "concurrency": 1, **options})
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


async def test_a_rerun_keeps_what_did_not_write_and_reruns_only_what_did(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection) -> None:
    types = ["ok", "noop", "ok", "fail_before_write", "noop", "ok", "write_then_fail", "ok"]
    ids = await enqueue_in_order(engine, types)
    runs: Counter[uuid.UUID] = Counter()
    runner, report = await run(db_url, writers(runs))
    # Job 0 alone; in the batch of jobs 1-7 the write_then_fail (6) rolls it
    # back: only the two ok jobs before it that wrote (2 and 5) run again.
    assert report["rerun"] == 2
    assert [runs[i] for i in ids] == [1, 1, 2, 1, 1, 2, 1, 1]
    assert report["processed"] == 6 and report["failed"] == 2
    assert await conn.fetchval("SELECT count(*) FROM effects") == types.count("ok")


async def test_a_culprit_is_recorded_once_even_when_its_rerun_is_cut(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection) -> None:
    """100 writing jobs before the culprit: their rerun, each in a savepoint,
    fills a transaction at 64; the culprit's failed attempt is recorded in it
    all the same, and it does not run again before its retry is due."""
    registry_runs: Counter[uuid.UUID] = Counter()
    ids = await enqueue_in_order(engine, ["ok"] * 101)
    async with engine.begin() as s:
        culprit = await enqueue(s, "write_then_fail", {}, max_retries=3)
    _, report = await run(db_url, writers(registry_runs))
    assert registry_runs[culprit] == 1 and report["rerun"] == 100
    row = await conn.fetchrow(
        "SELECT status, retry_count, jsonb_array_length(error_history) AS n FROM jobs "
        "WHERE id = $1", culprit)
    assert tuple(row) == ("retrying", 1, 1)
    assert await conn.fetchval("SELECT count(DISTINCT job_id) FROM effects") == len(ids)
    assert await conn.fetchval("SELECT count(*) FROM effects") == len(ids)


async def test_a_handler_that_leaves_its_savepoint_open_fails_alone(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection, checked_effects: None
        ) -> None:
    """Returning inside its own begin_nested() fails the job; the jobs after it,
    a failing one included, cannot reach back into its savepoint."""
    runs: Counter[uuid.UUID] = Counter()
    registry = writers(runs)

    @registry.register("leak")
    async def leak(session: AsyncSession, payload: dict[str, Any]) -> None:
        await session.execute(text("INSERT INTO effects (job_id) VALUES (:id)"),
                              {"id": current_job().id})
        await session.begin_nested()  # and returns without closing it

    for savepoints in ("always", "auto"):
        await conn.execute("TRUNCATE jobs, effects")
        types = ["ok", "ok", "leak", "write_then_fail", "ok", "db_error", "ok"]
        ids = await enqueue_in_order(engine, types)
        _, report = await run(db_url, registry, savepoints=savepoints)
        status = dict(await conn.fetch("SELECT id, status FROM jobs"))
        assert [status[i] for i in ids] == [
            "completed", "completed", "failed", "failed", "completed", "failed", "completed"]
        error = await conn.fetchval("SELECT error_message FROM jobs WHERE id = $1", ids[2])
        assert "begin_nested" in error
        written = Counter(r["job_id"] for r in await conn.fetch("SELECT job_id FROM effects"))
        assert [written[i] for i in ids] == [1, 1, 0, 0, 1, 0, 1], savepoints


@pytest.mark.filterwarnings("ignore:transaction already deassociated")  # SQLAlchemy says so too
async def test_committing_the_sessions_connection_is_refused_too(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection) -> None:
    registry = HandlerRegistry()

    @registry.register("commits")
    async def commits(session: AsyncSession, payload: dict[str, Any]) -> None:
        await session.execute(text("INSERT INTO effects (job_id) VALUES (:id)"),
                              {"id": current_job().id})
        await (await session.connection()).commit()

    for savepoints in ("always", "auto"):
        await conn.execute("TRUNCATE jobs, effects")
        await enqueue_in_order(engine, ["commits"] * 3)
        _, report = await run(db_url, registry, savepoints=savepoints)
        assert report["failed"] == 3 and report["processed"] == 0
        assert await conn.fetchval("SELECT count(*) FROM effects") == 0
        errors = {r[0] for r in await conn.fetch("SELECT error_message FROM jobs")}
        assert errors == {"HandlerCommitError: handlers must not commit: their writes commit "
                          "with the job's completion"}


async def test_a_handler_may_recover_from_an_error_inside_its_own_savepoint(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection) -> None:
    """The PostgreSQL way (lesson 05): the failing statement in a
    begin_nested() of its own, the error caught outside it. The job
    completes with what it wrote instead, and nothing is rerun."""
    await conn.execute("CREATE UNIQUE INDEX ON effects (job_id, n)")
    registry = HandlerRegistry()

    @registry.register("upsert")
    async def upsert(session: AsyncSession, payload: dict[str, Any]) -> None:
        insert = text("INSERT INTO effects (job_id, n) VALUES (:id, :n)")
        await session.execute(insert, {"id": current_job().id, "n": 1})
        try:
            async with session.begin_nested():
                await session.execute(insert, {"id": current_job().id, "n": 1})  # duplicate
        except IntegrityError:
            await session.execute(insert, {"id": current_job().id, "n": 2})

    for savepoints in ("always", "auto"):
        await conn.execute("TRUNCATE jobs, effects")
        ids = await enqueue_in_order(engine, ["upsert"] * 4)
        runner, report = await run(db_url, registry, savepoints=savepoints)
        assert report["processed"] == 4 and report["rerun"] == 0
        assert runner.isolated_types == set()
        rows = await conn.fetch("SELECT job_id, n FROM effects")
        assert sorted((r["job_id"], r["n"]) for r in rows) == sorted(
            (i, n) for i in ids for n in (1, 2))


@pytest.mark.serial  # batches are sized by the lane's pace: another test's load shrinks them
async def test_one_savepoint_hungry_job_does_not_shrink_later_batches(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection) -> None:
    """A job that opened 70 savepoints (more than a batch may) is its type's
    business: the 300 jobs of another type after it still go in batches (sized
    by the pace of the slow job first, then larger), not one to a batch."""
    seen: list[tuple[int, bool]] = []
    registry = probing(conn, seen, nested=SAVEPOINT_LIMIT + 6)
    registry.add("noop", writers(Counter()).get("noop"))  # type: ignore[arg-type]
    await enqueue_in_order(engine, ["write"] + ["noop"] * 300)
    _, report = await run(db_url, registry)
    assert seen and all(over for _, over in seen)  # it did overflow, alone in its batch
    assert report["processed"] == 301 and report["batches"] <= 10


@pytest.mark.parametrize("quick_batch", [5.0, 0.0], ids=["taken", "claimed"])
async def test_a_handler_that_updates_its_own_job_still_completes_it_once(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection, quick_batch: float) -> None:
    """A quick batch records its jobs where `take` found their rows
    (`complete_taken`), a claimed one where `claim` wrote them
    (`complete_claimed`); a handler that wrote its own job's row moved it. That
    job is recorded by id instead, with its handler's write kept, and its
    batch-mates by where they were; nothing is rolled back or run twice."""
    registry = HandlerRegistry()
    runs: Counter[uuid.UUID] = Counter()

    @registry.register("touch_own")
    async def touch_own(session: AsyncSession, payload: dict[str, Any]) -> None:
        runs[current_job().id] += 1
        if payload["touch"]:
            await session.execute(text("UPDATE jobs SET payload = payload || '{\"seen\": 1}' "
                                       "WHERE id = :id"), {"id": current_job().id})

    ids = []
    async with engine.begin() as s:
        for i in range(6):
            ids.append(await enqueue(s, "touch_own", {"touch": i % 3 == 1}))
    _, report = await run(db_url, registry, quick_batch=quick_batch)
    assert report["processed"] == 6 and report["rerun"] == 0
    assert report["batches"] < 6  # batches of several jobs, so moved rows had batch-mates
    rows = {r["id"]: r for r in await conn.fetch("SELECT id, status, payload FROM jobs")}
    assert all(runs[job_id] == 1 for job_id in ids)
    for i, job_id in enumerate(ids):
        assert rows[job_id]["status"] == "completed"
        assert ("seen" in rows[job_id]["payload"]) == (i % 3 == 1)


class _Base(DeclarativeBase):
    pass


class _Effect(_Base):
    """The `effects` table as an ORM model (no primary key of its own: the
    mapper is told to treat job_id as one)."""

    __tablename__ = "effects"
    job_id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    n: Mapped[int]


async def test_orm_objects_a_handler_adds_and_does_not_flush_commit_with_its_job(
    engine: AsyncEngine, db_url: str, conn: asyncpg.Connection
) -> None:
    """`session.add` without a flush: the worker flushes before recording the
    job, for every job of a batch, the first and the others (each job's
    `added` flag is its own), and an added-then-expunged object writes
    nothing."""
    registry = HandlerRegistry()

    @registry.register("add")
    async def add(session: AsyncSession, payload: dict[str, Any]) -> None:
        obj = _Effect(job_id=current_job().id, n=payload["n"])
        session.add(obj)
        if payload.get("forget"):
            session.expunge(obj)

    async with engine.begin() as s:
        for n in range(5):
            await enqueue(s, "add", {"n": n})
        await enqueue(s, "add", {"n": 99, "forget": True})
    report = await drain_all(db_url, registry=registry)
    assert report["processed"] == 6
    rows = await conn.fetch("SELECT j.id, e.n FROM jobs AS j JOIN effects AS e ON e.job_id = j.id")
    assert sorted(r["n"] for r in rows) == [0, 1, 2, 3, 4]
    assert await conn.fetchval("SELECT count(*) FROM jobs WHERE status = 'completed'") == 6
