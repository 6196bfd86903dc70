"""Routing: queues, priorities, unique keys, pause and limits, in one process.

(The limits kept across several worker processes are in test_limits.py.)
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from jobqueue import HandlerRegistry, enqueue, enqueue_many, queues
from jobqueue.testing import drain, wait_for
from jobqueue.worker.config import WorkerConfig, parse_queues


def recorder(seen: list[tuple[str, Any]], *types: str) -> HandlerRegistry:
    registry = HandlerRegistry()
    for job_type in types:
        async def handler(session: Any, payload: dict[str, Any], job_type: str = job_type
                          ) -> None:
            seen.append((job_type, payload.get("n")))
        registry.add(job_type, handler)
    return registry


async def test_higher_priority_runs_first_then_earlier_due(engine: AsyncEngine,
                                                           db_url: str) -> None:
    seen: list[tuple[str, Any]] = []
    async with engine.begin() as s:
        for n, priority in enumerate([0, 5, 0, -3, 5, 10]):
            await enqueue(s, "t", {"n": n}, priority=priority)
            await s.execute(__import__("sqlalchemy").text("SELECT pg_sleep(0.002)"))
    await drain(db_url, registry=recorder(seen, "t"), concurrency=1, quick_batch=0,
                batch_size=1)
    # 10 first; the two 5s in due (enqueue) order; then the 0s; -3 last.
    assert [n for _, n in seen] == [5, 1, 4, 0, 2, 3]


async def test_a_worker_serves_only_its_queues(engine: AsyncEngine, db_url: str,
                                               conn: asyncpg.Connection) -> None:
    seen: list[tuple[str, Any]] = []
    async with engine.begin() as s:
        await enqueue_many(s, "t", [{"n": 1}, {"n": 2}], queue="emails")
        await enqueue(s, "t", {"n": 3}, queue="reports")
        await enqueue(s, "t", {"n": 4})  # default
    await drain(db_url, registry=recorder(seen, "t"), queues="emails,reports")
    assert sorted(n for _, n in seen) == [1, 2, 3]
    left = await conn.fetch("SELECT queue, status FROM jobs WHERE status <> 'completed'")
    assert [(r["queue"], r["status"]) for r in left] == [("default", "pending")]
    await drain(db_url, registry=recorder(seen, "t"))  # every queue: the last one too
    assert sorted(n for _, n in seen) == [1, 2, 3, 4]


async def test_a_flood_in_one_queue_does_not_starve_another(engine: AsyncEngine,
                                                             db_url: str) -> None:
    seen: list[tuple[str, Any]] = []
    async with engine.begin() as s:
        await enqueue_many(s, "flood", [{"n": n} for n in range(300)], queue="bulk")
        await enqueue(s, "urgent", {"n": "u"}, queue="mail")
    # One lane, batches of 50: the mail job must come within the first two batches.
    await drain(db_url, registry=recorder(seen, "flood", "urgent"), concurrency=1,
                batch_size=50, quick_batch=0)
    assert len(seen) == 301
    assert seen.index(("urgent", "u")) <= 50


async def test_lanes_per_queue() -> None:
    config = WorkerConfig(queues="emails=3,reports")
    assert config.lane_queues == [("emails",)] * 3 + [("reports",)]
    assert config.served == ("emails", "reports")
    assert WorkerConfig(queues=["a", "b"], concurrency=2).lane_queues == [("a", "b")] * 2
    assert WorkerConfig().lane_queues == [None, None] and WorkerConfig().served is None


@pytest.mark.parametrize("spec, message", [
    ("emails,,reports", "empty name"),
    ("emails=0", "lanes must be a whole number, 1 or more"),
    ("emails=x", "lanes must be a whole number"),
    ("bad name", "not a valid name"),
    ("a,a", "named twice"),
])
def test_bad_queue_specs_are_refused(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_queues(spec)


async def test_lanes_per_queue_drain_each_queue(engine: AsyncEngine, db_url: str) -> None:
    seen: list[tuple[str, Any]] = []
    async with engine.begin() as s:
        await enqueue_many(s, "t", [{"n": n} for n in range(20)], queue="a")
        await enqueue_many(s, "t", [{"n": n} for n in range(20, 30)], queue="b")
    report = await drain(db_url, registry=recorder(seen, "t"), queues={"a": 2, "b": 1})
    assert sorted(n for _, n in seen) == list(range(30))
    assert report["processed"] == 30


@pytest.mark.parametrize("field, value, message", [
    ("queue", "no spaces", "not a valid name"),
    ("queue", "x" * 65, "not a valid name"),
    ("queue", 7, "must be a string"),
    ("priority", 1001, "between -1000 and 1000"),
    ("priority", 1.5, "whole number"),
    ("priority", True, "whole number"),
    ("unique_key", "", "must not be empty"),
    ("unique_key", "k" * 256, "limit is 255"),
])
async def test_bad_routing_is_refused_before_anything_is_written(
    engine: AsyncEngine, conn: asyncpg.Connection, field: str, value: Any, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        async with engine.begin() as s:
            await enqueue(s, "t", {}, **{field: value})
    assert await conn.fetchval("SELECT count(*) FROM jobs") == 0


async def test_a_plain_sql_insert_lands_in_the_default_queue(conn: asyncpg.Connection) -> None:
    row = await conn.fetchrow(
        "INSERT INTO jobs (job_type, payload) VALUES ('x', '{}') RETURNING queue, priority,"
        " unique_key")
    assert dict(row) == {"queue": "default", "priority": 0, "unique_key": None}
    with pytest.raises(asyncpg.CheckViolationError):
        await conn.execute("INSERT INTO jobs (job_type, queue) VALUES ('x', 'bad name')")


async def test_a_unique_key_makes_one_job_while_it_is_unfinished(
    engine: AsyncEngine, db_url: str, conn: asyncpg.Connection
) -> None:
    async with engine.begin() as s:
        first = await enqueue(s, "t", {"n": 1}, unique_key="invoice:42")
        again = await enqueue(s, "t", {"n": 2}, unique_key="invoice:42")
        other = await enqueue(s, "t", {"n": 3}, unique_key="invoice:43")
    assert again == first and other != first
    assert await conn.fetchval("SELECT count(*) FROM jobs") == 2
    await drain(db_url, registry=recorder([], "t"))
    async with engine.begin() as s:  # finished: the key is free again
        after = await enqueue(s, "t", {"n": 4}, unique_key="invoice:42")
    assert after != first
    assert await conn.fetchval("SELECT count(*) FROM jobs WHERE unique_key = 'invoice:42'") == 2


async def test_concurrent_enqueues_of_one_key_make_one_job(
    engine: AsyncEngine, conn: asyncpg.Connection
) -> None:
    go = asyncio.Event()

    async def one(n: int) -> Any:
        async with engine.begin() as s:
            await go.wait()
            job_id = await enqueue(s, "t", {"n": n}, unique_key="welcome:7")
            await asyncio.sleep(0.05)  # hold the transaction open: the others must wait
            return job_id

    tasks = [asyncio.create_task(one(n)) for n in range(8)]
    await asyncio.sleep(0.2)  # every task has its connection and waits at the gate
    go.set()
    ids = await asyncio.gather(*tasks)
    assert len(set(ids)) == 1
    assert await conn.fetchval("SELECT count(*) FROM jobs") == 1


async def test_a_paused_queue_starts_nothing_and_resumes(
    engine: AsyncEngine, db_url: str, conn: asyncpg.Connection
) -> None:
    seen: list[tuple[str, Any]] = []
    async with engine.begin() as s:
        await enqueue_many(s, "t", [{"n": n} for n in range(5)], queue="mail")
        await enqueue(s, "t", {"n": "other"})
        await queues.pause(s, "mail")
    await drain(db_url, registry=recorder(seen, "t"))
    assert seen == [("t", "other")]  # the worker ran, and left the paused queue alone
    assert await conn.fetchval("SELECT count(*) FROM jobs WHERE queue = 'mail' "
                               "AND status = 'pending'") == 5
    async with engine.begin() as s:
        await queues.resume(s, "mail")
    assert await conn.fetchval("SELECT count(*) FROM jobqueue_queues") == 0  # nothing kept
    await drain(db_url, registry=recorder(seen, "t"))
    assert len(seen) == 6


async def test_a_concurrency_limit_is_claimed_through_admission(
    engine: AsyncEngine, db_url: str, conn: asyncpg.Connection
) -> None:
    running: list[int] = []
    peak = [0]
    registry = HandlerRegistry()

    @registry.register("slow")
    async def slow(session: Any, payload: dict[str, Any]) -> None:
        running.append(1)
        peak[0] = max(peak[0], len(running))
        if peak[0] < 2:  # the first waits for a second to start (the limit lets one in)
            await wait_for(lambda: peak[0] >= 2, timeout=10, message="a second job running")
        await asyncio.sleep(0.02)
        running.pop()

    async with engine.begin() as s:
        await enqueue_many(s, "slow", [{}] * 30, queue="mail")
        await queues.limit(s, "mail", concurrency=2)
    report = await drain(db_url, registry=registry, concurrency=4)
    assert report["processed"] == 30
    assert peak[0] == 2  # four lanes, never more than two at once
    row = await conn.fetchrow("SELECT concurrency, rate_limit FROM jobqueue_queues")
    assert dict(row) == {"concurrency": 2, "rate_limit": None}


async def test_a_rate_limit_counts_starts_per_window(
    engine: AsyncEngine, db_url: str, conn: asyncpg.Connection
) -> None:
    async with engine.begin() as s:
        await enqueue_many(s, "t", [{}] * 24, queue="api")
        await queues.limit(s, "api", rate="10/s")
    await drain(db_url, registry=recorder([], "t"), concurrency=2)
    per_second = [r["n"] for r in await conn.fetch(
        "SELECT date_trunc('second', started_at) AS s, count(*) AS n FROM jobs "
        "GROUP BY 1 ORDER BY 1")]
    assert sum(per_second) == 24 and len(per_second) >= 3
    assert max(per_second) <= 10


@pytest.mark.parametrize("kwargs, message", [
    ({"concurrency": 0}, "between 1 and"),
    ({"concurrency": -5}, "between 1 and"),
    ({"rate": "ten/s"}, "must look like"),
    ({"rate": "0/s"}, "1 to"),
    ({"rate": "5/d"}, "must look like"),
])
async def test_bad_limits_are_refused_and_nothing_is_written(
    engine: AsyncEngine, conn: asyncpg.Connection, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        async with engine.begin() as s:
            await queues.limit(s, "mail", **kwargs)
    assert await conn.fetchval("SELECT count(*) FROM jobqueue_queues") == 0


def test_rates_parse_and_print() -> None:
    assert queues.parse_rate("20/s") == queues.Rate(20, 1.0)
    assert str(queues.parse_rate(" 100 / m ")) == "100/m"
    assert queues.parse_rate("5/h").period == 3600.0


async def test_every_lane_knows_a_limited_queue_from_its_first_claim(
    engine: AsyncEngine, db_url: str, conn: asyncpg.Connection
) -> None:
    registry = HandlerRegistry()

    @registry.register("slow")
    async def slow(session: Any, payload: dict[str, Any]) -> None:
        await asyncio.sleep(0.5)

    async with engine.begin() as s:
        await enqueue_many(s, "slow", [{}] * 2, queue="mail")
        await queues.limit(s, "mail", concurrency=2)
    # A lane that took the queue for a plain one would come away empty and
    # sleep a whole poll interval: the two jobs would then run one after the other.
    await drain(db_url, registry=registry, concurrency=4, poll_interval=30, queues="mail")
    overlap = await conn.fetchval(
        "SELECT count(*) FROM jobs AS a JOIN jobs AS b ON a.id < b.id "
        "AND a.started_at < b.completed_at AND b.started_at < a.completed_at")
    assert await conn.fetchval("SELECT count(*) FROM jobs WHERE status = 'completed'") == 2
    assert overlap == 1  # they ran side by side
