"""What the routing process tests' handler modules share: each handler writes
its module's name and its process id beside the job (through the job's own
session, so the row commits exactly when the job does)."""

from __future__ import annotations

import os
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from jobqueue.registry import handlers
from jobqueue.worker import current_job


def register(job_type: str, name: str) -> None:
    """A handler for `job_type` that records `name` as the one that ran it."""

    async def handler(session: AsyncSession, payload: dict[str, Any]) -> None:
        await session.execute(
            text("INSERT INTO events (job_id, kind, worker_pid) VALUES (:id, :kind, :pid)"),
            {"id": current_job().id, "kind": name, "pid": os.getpid()})

    handlers.add(job_type, handler)
