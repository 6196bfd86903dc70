"""Enqueue joins the caller's transaction, and bad input writes nothing."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from jobqueue import HandlerRegistry, enqueue, enqueue_many
from jobqueue.enqueue import PAYLOAD_MAX_BYTES, try_enqueue
from jobqueue.retry import RetryPolicy


async def _jobs(conn: asyncpg.Connection) -> int:
    return await conn.fetchval("SELECT count(*) FROM jobs")


async def test_enqueue_is_invisible_until_commit_and_gone_on_rollback(
    engine: AsyncEngine, conn: asyncpg.Connection
) -> None:
    sessions = async_sessionmaker(engine)
    async with sessions() as s:
        async with s.begin():
            job_id = await enqueue(s, "send_email", {"to": "a@b.c"})
            assert await _jobs(conn) == 0  # another connection cannot see it yet
        stored = await conn.fetchval("SELECT job_type FROM jobs WHERE id = $1", job_id)
        assert stored == "send_email"

    async with sessions() as s:
        await s.begin()
        await enqueue(s, "send_email", {"to": "x@y.z"})
        await enqueue_many(s, "send_email", [{"to": "p@q.r"}] * 5)
        await s.rollback()
    assert await _jobs(conn) == 1


async def test_enqueue_many_keeps_order_and_defaults(engine, conn: asyncpg.Connection) -> None:
    payloads = [{"i": i} for i in range(500)]
    async with engine.begin() as c:
        ids = await enqueue_many(c, "noop", payloads, max_retries=7)
    rows = await conn.fetch("SELECT id, payload::text AS p, status, max_retries, retry_count, "
                            "error_history::text AS h FROM jobs")
    by_id = {r["id"]: r for r in rows}
    assert [by_id[i]["p"] for i in ids] == [f'{{"i": {i}}}' for i in range(500)]
    assert {(r["status"], r["max_retries"], r["retry_count"], r["h"]) for r in rows} == {
        ("pending", 7, 0, "[]")}
    async with engine.begin() as c:
        assert await enqueue_many(c, "noop", []) == []


async def test_plain_sql_insert_gets_every_default(conn: asyncpg.Connection) -> None:
    row = await conn.fetchrow(
        "INSERT INTO jobs (job_type, payload) VALUES ('x', '{}') RETURNING *")
    assert row["status"] == "pending" and row["retry_count"] == 0 and row["max_retries"] == 3
    assert row["id"] is not None and row["created_at"] is not None
    assert row["run_at"] <= await conn.fetchval("SELECT now()")


BAD_CALLS = [
    (("", {}), {}, "must not be empty"),
    (("x" * 101, {}), {}, "limit is 100"),
    ((42, {}), {}, "must be a string"),
    (("t", [1, 2]), {}, "JSON object"),
    (("t", "text"), {}, "JSON object"),
    (("t", {"x": math.nan}), {}, "not valid JSON"),
    (("t", {"x": object()}), {}, "not valid JSON"),
    (("t", {"x": "a\x00b"}), {}, "NUL"),
    (("t", {"x": "\ud800"}), {}, "surrogate"),
    (("t", {"x": "y" * PAYLOAD_MAX_BYTES}), {}, "limit is"),
    (("t", {}), {"max_retries": -1}, "between 0 and"),
    (("t", {}), {"max_retries": 10**6}, "between 0 and"),
    (("t", {}), {"max_retries": True}, "whole number"),
    (("t", {}), {"max_retries": 2.5}, "whole number"),
    (("t", {}), {"run_at": datetime(2030, 1, 1)}, "time zone"),
    (("t", {}), {"run_at": "tomorrow"}, "datetime"),
    (("t", {}), {"run_at": datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14)))},
     "out of range"),
    (("a\ud800b", {}), {}, "surrogate"),
    (("t", {}), {"timeout": True}, "number of seconds"),
    (("t", {}), {"timeout": "30"}, "number of seconds"),
    (("t", {}), {"timeout": 0}, "more than 0 and at most 31,536,000"),
    (("t", {}), {"timeout": -1.5}, "more than 0"),
    (("t", {}), {"timeout": math.nan}, "more than 0"),
    (("t", {}), {"timeout": math.inf}, "more than 0"),
    (("t", {}), {"timeout": 31_536_001}, "at most 31,536,000"),
]


@pytest.mark.parametrize(("args", "kwargs", "message"), BAD_CALLS)
async def test_bad_input_is_a_clear_error_and_writes_nothing(
    engine: AsyncEngine, conn: asyncpg.Connection, args, kwargs, message
) -> None:
    async with engine.begin() as c:
        with pytest.raises(ValueError, match=message):
            await enqueue(c, *args, **kwargs)
        with pytest.raises(ValueError, match=message):
            await enqueue_many(c, args[0], [{"fine": 1}, args[1]], **kwargs)
    assert await _jobs(conn) == 0


async def test_enqueue_many_names_the_bad_payload(engine: AsyncEngine, conn) -> None:
    async with engine.begin() as c:
        with pytest.raises(ValueError, match=r"payload #2"):
            await enqueue_many(c, "t", [{}, {}, {"x": "\x00"}])
    assert await _jobs(conn) == 0


async def test_a_timeout_is_stored_with_the_job(engine: AsyncEngine, conn) -> None:
    async with engine.begin() as c:
        one = await enqueue(c, "t", {}, timeout=30)
        many = await enqueue_many(c, "t", [{}, {}], timeout=0.25)
        keyed = await try_enqueue(c, "t", {}, unique_key="k", timeout=31_536_000)
        plain = await enqueue(c, "t", {})
    rows = dict(await conn.fetch("SELECT id, timeout FROM jobs"))
    assert rows == {one: 30.0, many[0]: 0.25, many[1]: 0.25, keyed.id: 31_536_000.0,
                    plain: None}


async def noop(session: object, payload: dict) -> None:
    return None


def test_a_job_type_has_a_default_timeout_checked_where_it_is_registered() -> None:
    registry = HandlerRegistry()
    registry.register("slow", timeout=120)(noop)
    registry.register("plain")(noop)
    assert registry.timeout("slow") == 120.0 and registry.timeout("plain") is None
    assert registry.timeout("unknown") is None
    for bad, message in ((0, "more than 0"), (True, "number of seconds"),
                         (math.inf, "more than 0"), (40_000_000, "at most 31,536,000")):
        with pytest.raises(ValueError, match=message) as raised:
            registry.register("bad", timeout=bad)(noop)
        assert "'bad'" in str(raised.value) and "\n" not in str(raised.value)
    assert "bad" not in registry  # refused before the function was decorated
    registry.register("slow")(noop)  # registered again without one: no default any more
    assert registry.timeout("slow") is None
    registry.register("slow", timeout=5)(noop)
    registry.remove("slow")
    assert registry.timeout("slow") is None


async def test_run_at_in_any_time_zone_is_the_same_instant(engine, conn) -> None:
    at = datetime(2030, 1, 1, 12, tzinfo=timezone(timedelta(hours=2)))
    async with engine.begin() as c:
        job_id = await enqueue(c, "t", {}, run_at=at)
    assert await conn.fetchval("SELECT run_at FROM jobs WHERE id = $1", job_id) == at


def test_backoff_defaults_double_from_one_second_and_stop_at_the_cap() -> None:
    exact = RetryPolicy(jitter=0.0)
    assert [exact.delay(n) for n in range(1, 6)] == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert exact.delay(100) == 300.0
    jittered = RetryPolicy(base=10.0, jitter=0.5)
    delays = {jittered.delay(1) for _ in range(200)}
    assert all(5.0 <= d <= 10.0 for d in delays) and len(delays) > 100
    with pytest.raises(ValueError):
        RetryPolicy(jitter=2.0)
    with pytest.raises(ValueError):
        RetryPolicy(factor=0.5)
