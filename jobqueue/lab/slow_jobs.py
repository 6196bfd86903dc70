"""The job lesson 07's worker processes run (`jobqueue worker --import
jobqueue.lab.slow_jobs`): `slow_write` waits a while, like a call to a slow
service, then writes one row through its session.

The row commits with the job's completion or vanishes with its batch, so
`lab_writes` counts how many times a job's *database* work happened, however
many times its handler started: after a worker is killed mid-batch, each job
it held must have exactly one row, written by the worker that completed it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from jobqueue import current_job
from jobqueue.registry import handlers

#: One row per committed run of a `slow_write` job.
WRITES_TABLE = """CREATE TABLE IF NOT EXISTS lab_writes (
    job_id uuid NOT NULL, attempt integer NOT NULL,
    written_at timestamptz NOT NULL DEFAULT clock_timestamp())"""


async def create_tables(conn: AsyncConnection | AsyncSession | asyncpg.Connection) -> None:
    if isinstance(conn, asyncpg.Connection):
        await conn.execute(WRITES_TABLE)
    else:
        await conn.execute(text(WRITES_TABLE))


@handlers.register("slow_write")
async def slow_write(session: AsyncSession, payload: dict[str, Any]) -> None:
    await asyncio.sleep(float(payload.get("seconds", 0.005)))
    job = current_job()
    await session.execute(text("INSERT INTO lab_writes (job_id, attempt) VALUES (:id, :attempt)"),
                          {"id": job.id, "attempt": job.attempt})
