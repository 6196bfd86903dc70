"""The course's own job runner, reproduced from its description, to measure
beside jobqueue on the same server.

Its design, kept: claim a batch with `SELECT … FOR UPDATE SKIP LOCKED`, mark
it `processing` and commit; load the jobs as ORM objects; then one transaction
per job: the handler inside `begin_nested()`, the job loaded again with
`session.get` and marked completed through the ORM, commit. Its known bugs
(nested `session.begin()`, the off-by-one retry count, the client-side clock)
are not reproduced: the point is to measure the design, not the bugs. Only the
success path runs here: the benchmark's jobs never fail.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

from jobqueue.schema.models import Job, JobStatus


async def drain(url: str, *, batch_size: int = 10) -> dict[str, Any]:
    """Process every pending job the course's way; jobs/s and count."""
    engine = create_async_engine(url)
    sessions = async_sessionmaker(engine, expire_on_commit=False)
    processed = 0
    started = time.perf_counter()
    try:
        async with sessions() as session:
            while True:
                jobs = await _fetch_pickable(session, batch_size)
                if not jobs:
                    break
                for job in jobs:
                    async with session.begin():
                        async with session.begin_nested():
                            pass  # the no-op handler
                        row = await session.get(Job, job.id)
                        assert row is not None
                        row.status = JobStatus.COMPLETED.value
                        row.completed_at = func.now()  # the database's clock, in the UPDATE
                    processed += 1
    finally:
        await engine.dispose()
    seconds = time.perf_counter() - started
    return {"processed": processed, "seconds": seconds, "jobs_per_sec": processed / seconds}


async def _fetch_pickable(session: Any, batch_size: int) -> list[Job]:
    async with session.begin():
        ids = list((await session.execute(text(
            "SELECT id FROM jobs WHERE status IN ('pending', 'retrying') AND run_at <= now() "
            "ORDER BY created_at LIMIT :n FOR UPDATE SKIP LOCKED"), {"n": batch_size})).scalars())
        if not ids:
            return []
        await session.execute(text(
            "UPDATE jobs SET status = 'processing', started_at = now() WHERE id = ANY(:ids)"),
            {"ids": ids})
    async with session.begin():
        return list((await session.execute(select(Job).where(Job.id.in_(ids)))).scalars())
