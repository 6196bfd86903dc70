"""oban-py's workers, run by `oban start` in oban-py's own virtualenv on
`PYTHONPATH` alone (so nothing from jobqueue), found by the dotted name each
job row carries (`bench_oban.WriteRow`). oban-py lends its pool to nothing
but itself, so the tasks share a psycopg pool of their own, sized to the
queue's limit; a task's write commits on its own, before oban-py records
the job's completion, as with the other peers.
"""

from __future__ import annotations

import asyncio
import os
from decimal import Decimal
from typing import Any

from oban import worker
from psycopg_pool import AsyncConnectionPool

# The seed's `process_payment` statements (`jobqueue.lab.examples`), in psycopg's placeholders.
CREDIT = "UPDATE demo_users SET balance = balance + %s WHERE id = %s RETURNING balance"
RECORD = "INSERT INTO demo_payments (payment_id, user_id, amount) VALUES (%s, %s, %s)"

_pool: AsyncConnectionPool | None = None
_opening = asyncio.Lock()


async def pool() -> AsyncConnectionPool:
    """The tasks' pool (libpq's environment names the database)."""
    global _pool
    async with _opening:
        if _pool is None:
            size = int(os.environ.get("BENCH_POOL_SIZE", "10"))
            opened = AsyncConnectionPool("", min_size=1, max_size=size, open=False)
            await opened.open()
            _pool = opened
    return _pool


@worker(queue="default")
class Noop:
    async def process(self, job: Any) -> None:
        return None


@worker(queue="default")
class WriteRow:
    async def process(self, job: Any) -> None:
        async with (await pool()).connection() as conn:
            await conn.execute("INSERT INTO bench_rows (job_id) VALUES (%s)", (job.id,))


@worker(queue="default")
class ProcessPayment:
    async def process(self, job: Any) -> None:
        user, amount = int(job.args["user_id"]), Decimal(job.args["amount"])
        async with (await pool()).connection() as conn, conn.transaction():
            credited = await conn.execute(CREDIT, (amount, user))
            if await credited.fetchone() is None:
                raise LookupError(f"no user {user}")
            await conn.execute(RECORD, (job.args["payment_id"], user, amount))
