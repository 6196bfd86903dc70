"""jobqueue.lab.bouncer: the transaction-pooling stand-in lesson 03 runs, on
real server connections: what it hands out, and what it does to locks."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from jobqueue.lab import bouncer, locks
from jobqueue.testing import wait_for
from tests.lab.conftest import Labelled

KEY = 21


@pytest.fixture
async def servers(labelled: Labelled) -> dict[str, asyncpg.Connection]:
    """Two server connections and an observer, labelled as lesson 03 labels them."""
    return await labelled("server 1", "server 2", "watch")


def _pool(servers: dict[str, asyncpg.Connection]) -> bouncer.TransactionPool:
    return bouncer.TransactionPool({name: servers[name] for name in ("server 1", "server 2")})


def _route(pool: bouncer.TransactionPool) -> list[tuple[str, str, str]]:
    return [(r["client"], r["server"], r["statement"]) for r in pool.log]


async def test_each_transaction_takes_the_idle_server_used_last(
        servers: dict[str, asyncpg.Connection]) -> None:
    pool = _pool(servers)
    x, y = pool.client("X"), pool.client("Y")
    assert await x.fetchval("SELECT 1") == 1
    assert await y.fetchval("SELECT 2") == 2
    async with x.transaction():
        await x.fetchval("SELECT 3")
        await y.fetchval("SELECT 4")  # server 1 is X's until its COMMIT
    await y.fetchval("SELECT 5")  # server 1 was handed back last: on top again
    assert _route(pool) == [
        ("X", "server 1", "SELECT 1"), ("Y", "server 1", "SELECT 2"),
        ("X", "server 1", "BEGIN"), ("X", "server 1", "SELECT 3"),
        ("Y", "server 2", "SELECT 4"), ("X", "server 1", "COMMIT"),
        ("Y", "server 1", "SELECT 5")]
    assert [r["returned"] for r in pool.log if r["statement"].startswith("SELECT")] == [
        1, 2, 3, 4, 5]


async def test_a_session_lock_stays_behind_and_the_unlock_misses(
        servers: dict[str, asyncpg.Connection]) -> None:
    pool, watch = _pool(servers), servers["watch"]
    x, y = pool.client("X"), pool.client("Y")
    await x.fetchval("SELECT pg_advisory_lock($1)", KEY)
    assert await locks.holders(watch, KEY) == ["server 1"]
    async with y.transaction():
        assert await y.fetchval("SELECT pg_try_advisory_lock($1)", KEY) is True  # Y "has" it
        assert await x.fetchval("SELECT pg_advisory_unlock($1)", KEY) is False
    assert _route(pool)[3] == ("X", "server 2", "SELECT pg_advisory_unlock($1)")
    assert await locks.holders(watch, KEY) == ["server 1"]  # nobody released it
    await servers["server 1"].execute("SELECT pg_advisory_unlock_all()")
    assert await locks.advisory_locks(watch) == []


async def test_a_transaction_lock_ends_with_its_transaction(
        servers: dict[str, asyncpg.Connection]) -> None:
    pool, watch = _pool(servers), servers["watch"]
    x, y = pool.client("X"), pool.client("Y")
    async with x.transaction():
        await x.fetchval("SELECT pg_advisory_xact_lock($1)", KEY)
        async with y.transaction():
            assert await y.fetchval("SELECT pg_try_advisory_xact_lock($1)", KEY) is False
        assert await locks.holders(watch, KEY) == ["server 1"]
    assert await locks.advisory_locks(watch) == []


async def test_a_failed_transaction_rolls_back_and_hands_the_server_back(
        servers: dict[str, asyncpg.Connection]) -> None:
    pool, watch = _pool(servers), servers["watch"]
    x = pool.client("X")
    with pytest.raises(RuntimeError, match="boom"):
        async with x.transaction():
            await x.fetchval("SELECT pg_advisory_xact_lock($1)", KEY)
            raise RuntimeError("boom")
    assert _route(pool)[-1] == ("X", "server 1", "ROLLBACK")
    assert await locks.advisory_locks(watch) == []
    with pytest.raises(RuntimeError, match="already in a transaction"):
        async with x.transaction(), x.transaction():
            pass
    await x.fetchval("SELECT 1")
    assert _route(pool)[-1] == ("X", "server 1", "SELECT 1")  # both servers idle again


async def test_a_transaction_waits_while_every_server_is_busy(
        servers: dict[str, asyncpg.Connection]) -> None:
    pool = bouncer.TransactionPool({"server 1": servers["server 1"]})
    x, y = pool.client("X"), pool.client("Y")
    async with x.transaction():
        later = asyncio.create_task(y.fetchval("SELECT 2"))
        await wait_for(lambda: pool.waiting == 1, timeout=5, message="Y waiting for a server")
        assert not later.done()
    assert await asyncio.wait_for(later, 5) == 2
    assert pool.waiting == 0
    assert _route(pool)[-1] == ("Y", "server 1", "SELECT 2")
