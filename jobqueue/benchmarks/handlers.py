"""Handlers the benchmarks and the lab run (`--import jobqueue.benchmarks.handlers`).

Each does a known amount of work so that a measurement says what it measures:
nothing at all, a fixed sleep (I/O), or one row written through the handler's
session (database work that commits with the job). The same as plain `def`
handlers, run in threads, are in `jobqueue.benchmarks.sync_handlers`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from jobqueue import current_job
from jobqueue.registry import handlers

#: The table `write_row` fills (`scenarios.open_bench` creates it).
BENCH_TABLE = """CREATE TABLE IF NOT EXISTS bench_rows (
    job_id uuid NOT NULL, written_at timestamptz NOT NULL DEFAULT clock_timestamp())"""

#: What `write_row` does, as a statement.
INSERT_ROW = "INSERT INTO bench_rows (job_id) VALUES (:id)"


@handlers.register("noop")
async def noop(session: AsyncSession, payload: dict[str, Any]) -> None:
    """Does nothing: a drain of these measures the queue, not a handler."""


@handlers.register("sleep")
async def sleep(session: AsyncSession, payload: dict[str, Any]) -> None:
    await asyncio.sleep(float(payload.get("seconds", 0.01)))


@handlers.register("write_row")
async def write_row(session: AsyncSession, payload: dict[str, Any]) -> None:
    await session.execute(text(INSERT_ROW), {"id": current_job().id})
