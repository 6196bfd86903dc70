"""The course's example handlers (`jobqueue.lab.examples`) in a real worker."""

from __future__ import annotations

import asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine

from jobqueue import HandlerRegistry, enqueue
from jobqueue.lab.examples import process_payment
from jobqueue.testing import drain


async def status_of(conn: asyncpg.Connection, job_id: object) -> str:
    return await conn.fetchval("SELECT status FROM jobs WHERE id = $1", job_id)


async def test_savepoint_keeps_a_failed_payment_from_touching_the_balance(
    engine: AsyncEngine, db_url: str, conn: asyncpg.Connection
) -> None:
    registry = HandlerRegistry()
    registry.add("process_payment", process_payment)
    await conn.execute("INSERT INTO demo_users (id, balance) VALUES (1, 100)")
    async with engine.begin() as s:
        good = await enqueue(s, "process_payment",
                             {"user_id": 1, "amount": 50, "payment_id": "p1"})
        duplicate = await enqueue(s, "process_payment",
                                  {"user_id": 1, "amount": 50, "payment_id": "p1"},
                                  max_retries=0)
        overdraft = await enqueue(s, "process_payment",
                                  {"user_id": 1, "amount": -1000, "payment_id": "p2"},
                                  max_retries=0)
        another = await enqueue(s, "process_payment",
                                {"user_id": 1, "amount": 25, "payment_id": "p3"})

    # One lane, one batch, one transaction (claimed whole: quick_batch=0): the
    # failures must roll back alone.
    report = await drain(db_url, registry=registry, batch_size=10, quick_batch=0,
                         concurrency=1)

    assert report["batches"] == 1
    assert await conn.fetchval("SELECT balance FROM demo_users WHERE id = 1") == 175
    assert await conn.fetchval("SELECT count(*) FROM demo_payments") == 2
    assert await status_of(conn, good) == "completed"
    assert await status_of(conn, another) == "completed"
    dup = await conn.fetchrow("SELECT * FROM jobs WHERE id = $1", duplicate)
    over = await conn.fetchrow("SELECT * FROM jobs WHERE id = $1", overdraft)
    assert dup["status"] == "failed" and "UniqueViolation" in dup["error_message"]
    assert over["status"] == "failed" and "CheckViolation" in over["error_message"]
