"""The recovery benchmark's handler (`--import jobqueue.benchmarks.recovery_runs`).

A module of its own, so that a worker imports only this, not the benchmark's
machinery.
"""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from jobqueue import current_job
from jobqueue.registry import handlers

#: A row per run of a `recovery_run` job that committed. Not keyed uniquely on
#: purpose: a job run twice leaves two rows instead of failing its second run.
RUNS_TABLE = "CREATE TABLE IF NOT EXISTS recovery_runs (job_id uuid NOT NULL)"


@handlers.register("recovery_run")
async def recovery_run(session: AsyncSession, payload: dict[str, Any]) -> None:
    """Sleeps `seconds`, then writes a row for this job in the job's own
    transaction: a run that did not commit leaves none."""
    await asyncio.sleep(float(payload["seconds"]))
    await session.execute(text("INSERT INTO recovery_runs (job_id) VALUES (:id)"),
                          {"id": current_job().id})
