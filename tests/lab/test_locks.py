"""jobqueue.lab.locks: the helpers lessons 1–3 look through, against a real server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine

from jobqueue.lab import locks
from jobqueue.schema.locks import LOCK_CLASS, WORKER_LOCK_CLASS
from jobqueue.worker import JobRunner
from tests.lab.conftest import Labelled


@pytest.fixture
async def named(labelled: Labelled) -> dict[str, asyncpg.Connection]:
    """Connections labelled A, B and watch, as `lab.connect` names them."""
    return await labelled("A", "B", "watch")


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[AsyncEngine]:
    eng = create_async_engine(db_url, pool_size=2)
    locks.label_pool(eng, "pool")
    yield eng
    await eng.dispose()


def test_connection_label() -> None:
    assert locks.connection_label("lab A") == "A"
    assert locks.connection_label("jobqueue worker 17 monitor host:1", {17: "W1"}) == "W1 monitor"
    assert locks.connection_label("jobqueue worker 18 active host:1", {17: "W1"}) == "worker active"
    assert locks.connection_label("psql") == "psql"
    assert locks.connection_label(None) == "?"


def test_key_from_name_is_a_stable_signed_bigint() -> None:
    key = locks.key_from_name("nightly-report")
    assert key == 7440995589958059143  # sha256's first 8 bytes: the same everywhere, always
    assert -(2**63) <= locks.key_from_name("x") < 2**63
    assert locks.key_from_name("a") != locks.key_from_name("b")
    assert any(locks.key_from_name(str(i)) < 0 for i in range(10))  # signed, not unsigned


def test_python_hash_differs_between_processes() -> None:
    assert locks.python_hash_in_new_process("x") != locks.python_hash_in_new_process("x")


@pytest.mark.parametrize("key", [0, 42, -1, 2**40 + 5, 2**63 - 1, -(2**63)])
async def test_split_key_matches_pg_locks(named: dict[str, asyncpg.Connection], key: int) -> None:
    a = named["A"]
    await a.fetchval("SELECT pg_advisory_lock($1)", key)
    (row,) = await locks.advisory_locks(named["watch"])
    assert (row["classid"], row["objid"], row["objsubid"]) == locks.split_key(key)
    assert await locks.holders(named["watch"], key) == ["A"]


async def test_pair_keys_and_bigint_keys_are_different_locks(
        named: dict[str, asyncpg.Connection]) -> None:
    a, b, watch = named["A"], named["B"], named["watch"]
    await a.fetchval("SELECT pg_advisory_lock($1)", 42)
    assert await b.fetchval("SELECT pg_try_advisory_lock($1, $2)", 0, 42)
    assert await locks.holders(watch, 42) == ["A"]
    assert await locks.holders(watch, (0, 42)) == ["B"]
    await a.fetchval("SELECT pg_advisory_lock($1, $2)", -1, 7)  # negative int4 shows unsigned
    assert await locks.holders(watch, (-1, 7)) == ["A"]


async def test_waiters_blocked_by_and_release(named: dict[str, asyncpg.Connection]) -> None:
    a, b, watch = named["A"], named["B"], named["watch"]
    await a.fetchval("SELECT pg_advisory_lock($1)", 5)
    waiting = asyncio.create_task(b.fetchval("SELECT pg_advisory_lock($1)", 5))
    assert await locks.wait_until_waiting(watch, "B") == "advisory"
    assert await locks.waiters(watch, 5) == ["B"]
    assert await locks.blocked_by(watch, "B") == ["A"]
    rows = await locks.advisory_locks(watch)
    assert [(r["connection"], r["granted"]) for r in rows] == [("A", True), ("B", False)]
    await a.fetchval("SELECT pg_advisory_unlock($1)", 5)
    await asyncio.wait_for(waiting, 5)
    assert await locks.holders(watch, 5) == ["B"]
    b.terminate()
    assert await locks.wait_until_free(watch, 5)


async def test_wait_until_waiting_times_out(named: dict[str, asyncpg.Connection]) -> None:
    with pytest.raises(TimeoutError):
        await locks.wait_until_waiting(named["watch"], "B", timeout=0.1)


async def test_server_log_collects_the_unlock_warning(
        named: dict[str, asyncpg.Connection]) -> None:
    log = locks.ServerLog()
    named["A"].add_log_listener(log)
    assert await named["A"].fetchval("SELECT pg_advisory_unlock($1)", 1) is False
    assert log.messages == ["WARNING: you don't own a lock of type ExclusiveLock"]


async def test_first_hashtext_collision(named: dict[str, asyncpg.Connection]) -> None:
    found = await locks.first_hashtext_collision(named["A"], "report-")
    assert found is not None
    one, other, shared = found
    assert one != other
    assert await named["A"].fetchval("SELECT hashtext($1) = hashtext($2)", one, other)
    assert await named["A"].fetchval("SELECT hashtext($1)", one) == shared
    assert await locks.first_hashtext_collision(named["A"], "report-", limit=10) is None


async def test_timeline_records_states(named: dict[str, asyncpg.Connection]) -> None:
    a, b, watch = named["A"], named["B"], named["watch"]
    timeline = locks.Timeline(watch, 9, ["A", "B"])
    await a.fetchval("SELECT pg_advisory_lock($1)", 9)
    await timeline.record("A locks")
    waiting = asyncio.create_task(b.fetchval("SELECT pg_advisory_lock($1)", 9))
    await locks.wait_until_waiting(watch, "B")
    await timeline.record("B waits")
    await a.fetchval("SELECT pg_advisory_unlock($1)", 9)
    await waiting
    await timeline.record("A unlocks")
    assert [(s["holder"], s["waiting"]) for s in timeline.rows()] == [
        ("A", "-"), ("A", "B"), ("B", "-")]
    assert timeline.states("A") == ["holds", "holds", ""]
    assert timeline.states("B") == ["", "waits", "holds"]
    fig = timeline.plot()
    assert len(fig.axes) == 1


def test_runs() -> None:
    assert locks._runs(["a", "a", "", "b"]) == [("a", 0, 2), ("", 2, 1), ("b", 3, 1)]
    assert locks._runs([]) == []


async def test_pooled_session_lock_leaks_and_unlocks_on_the_wrong_connection(
        pool: AsyncEngine, named: dict[str, asyncpg.Connection]) -> None:
    watch = named["watch"]
    async with pool.connect() as c:
        await c.execute(text("SELECT pg_advisory_lock(:k)"), {"k": 3})
        await c.commit()
    assert await locks.holders(watch, 3) == ["pool 1"]  # back in the pool, still locked
    async with pool.connect() as first, pool.connect() as second:
        assert await locks.backend_pid(first) != await locks.backend_pid(second)
        assert (await second.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": 3})
                ).scalar() is False
        assert (await first.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": 3})
                ).scalar() is True


async def test_advisory_lock_holds_and_releases_on_one_connection(
        pool: AsyncEngine, named: dict[str, asyncpg.Connection]) -> None:
    b, watch = named["B"], named["watch"]
    async with locks.advisory_lock(pool, 11) as acquired:
        assert acquired is True
        assert await locks.holders(watch, 11) == ["pool 1"]
        assert await b.fetchval("SELECT pg_try_advisory_lock($1)", 11) is False
        state = await watch.fetchval(
            "SELECT state FROM pg_stat_activity WHERE application_name = 'lab pool 1' "
            "AND datname = current_database()")
        assert state == "idle"  # committed after locking: not idle in transaction
        async with AsyncSession(pool) as other:  # other work runs on the other connection
            assert await locks.connection_of(watch, other) == "pool 2"
            await other.commit()
        assert await locks.holders(watch, 11) == ["pool 1"]
    assert await locks.advisory_locks(watch) == []
    async with locks.advisory_lock(pool, (LOCK_CLASS, 5), wait=False) as acquired:
        assert acquired is True
        # The pool hands out the connection returned first: the other session's.
        assert await locks.holders(watch, (LOCK_CLASS, 5)) == ["pool 2"]
    assert await locks.advisory_locks(watch) == []


async def test_advisory_lock_try_when_held(pool: AsyncEngine,
                                           named: dict[str, asyncpg.Connection]) -> None:
    await named["B"].fetchval("SELECT pg_advisory_lock($1)", 12)
    async with locks.advisory_lock(pool, 12, wait=False) as acquired:
        assert acquired is False
    assert await locks.holders(named["watch"], 12) == ["B"]  # B's lock untouched


async def test_advisory_lock_released_when_the_block_raises(
        pool: AsyncEngine, named: dict[str, asyncpg.Connection]) -> None:
    with pytest.raises(RuntimeError):
        async with locks.advisory_lock(pool, 13):
            raise RuntimeError("boom")
    assert await locks.advisory_locks(named["watch"]) == []
    async with pool.connect() as c:  # unlocked cleanly: the same connection was pooled again
        assert await locks.connection_of(named["watch"], c) == "pool 1"


async def test_advisory_lock_cancelled_while_waiting_leaves_nothing(
        pool: AsyncEngine, named: dict[str, asyncpg.Connection]) -> None:
    b, watch = named["B"], named["watch"]
    await b.fetchval("SELECT pg_advisory_lock($1)", 14)
    entered = asyncio.Event()

    async def take() -> None:
        async with locks.advisory_lock(pool, 14):
            entered.set()

    task = asyncio.create_task(take())
    await locks.wait_until_waiting(watch, "pool 1")
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await b.fetchval("SELECT pg_advisory_unlock($1)", 14)
    assert not entered.is_set()
    assert await locks.wait_until_free(watch, 14)
    async with pool.connect() as c:  # the waiting connection was dropped, not pooled
        assert await locks.connection_of(watch, c) == "pool 2"


async def test_advisory_lock_lost_connection_is_not_pooled(
        pool: AsyncEngine, named: dict[str, asyncpg.Connection]) -> None:
    watch = named["watch"]
    async with locks.advisory_lock(pool, 15) as acquired:
        assert acquired
        pid = await watch.fetchval(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'lab pool 1' "
            "AND datname = current_database()")
        assert await watch.fetchval("SELECT pg_terminate_backend($1, 5000)", pid)
    async with locks.advisory_lock(pool, 15) as acquired:  # a new connection, same pool
        assert acquired
        assert await locks.holders(watch, 15) == ["pool 2"]
    assert await locks.advisory_locks(watch) == []


async def test_jobqueue_locks_of_a_worker(db_url: str,
                                          named: dict[str, asyncpg.Connection]) -> None:
    runner = JobRunner(db_url, install_signal_handlers=False)
    run = asyncio.create_task(runner.run())
    try:
        await runner.wait_active()
        rows = await locks.wait_for_jobqueue_locks(named["watch"], {"W1": runner}, count=3)
        assert [(r["connection"], r["lock"], r["granted"]) for r in rows] == [
            ("W1 active", "active worker", True),
            ("W1 monitor", "maintenance leader", True),
            ("W1 active", "liveness of W1", True),
        ]
        assert rows[-1]["classid"] == WORKER_LOCK_CLASS
    finally:
        runner.stop()
        await run
    assert await locks.wait_for_jobqueue_locks(named["watch"], {}, count=0) == []
