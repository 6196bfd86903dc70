"""Pruning finished jobs past their retention, in slices that keep up with a busy queue."""

from __future__ import annotations

import asyncpg
import pytest

from jobqueue import JobRunner, maintenance
from jobqueue.schema.queries import queries

HOUR = 3600.0


async def add_jobs(conn: asyncpg.Connection, n: int, status: str, finished_ago: float | None
                   ) -> None:
    await conn.execute(
        "INSERT INTO jobs (job_type, status, completed_at) SELECT 'noop', $1,"
        " now() - make_interval(secs => $2) FROM generate_series(1, $3)",
        status, finished_ago, n)


async def by_status(conn: asyncpg.Connection) -> dict[str, int]:
    return {r["status"]: r["n"] for r in await conn.fetch(
        "SELECT status, count(*) AS n FROM jobs GROUP BY status")}


async def test_prune_deletes_only_finished_jobs_past_their_retention(
    conn: asyncpg.Connection
) -> None:
    await add_jobs(conn, 3, "completed", 2 * HOUR)
    await add_jobs(conn, 2, "completed", 60)
    await add_jobs(conn, 4, "failed", 2 * HOUR)
    await add_jobs(conn, 1, "failed", 48 * HOUR)
    await add_jobs(conn, 5, "pending", None)
    assert await maintenance.prune(conn, keep_completed=HOUR, keep_failed=24 * HOUR) == 4
    assert await by_status(conn) == {"completed": 2, "failed": 4, "pending": 5}


async def test_a_full_slice_prunes_again_next_tick_instead_of_a_minute_later(
    conn: asyncpg.Connection, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(maintenance, "PRUNE_SLICE", 2)
    await add_jobs(conn, 5, "completed", 2 * HOUR)
    runner = JobRunner(db_url, keep_completed=HOUR, install_signal_handlers=False)
    runner.worker_id = 4242
    await queries["register_worker"].fetch(conn, id=runner.worker_id, name="test",
                                           mode="exclusive")
    upkeep = maintenance.Upkeep(runner, conn, leader=True)
    pruned = [(await upkeep.run_once())["pruned"] for _ in range(4)]
    assert pruned == [2, 2, 1, 0]  # the last pass was not full: the next waits PRUNE_EVERY
    assert await by_status(conn) == {}


async def test_a_failing_prune_waits_its_minute_like_any_other(
    conn: asyncpg.Connection, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = 0

    async def broken(*args: object) -> int:
        nonlocal calls
        calls += 1
        raise asyncpg.QueryCanceledError("canceling statement due to statement timeout")

    monkeypatch.setattr(maintenance, "prune", broken)
    runner = JobRunner(db_url, install_signal_handlers=False)
    runner.worker_id = 4243
    await queries["register_worker"].fetch(conn, id=runner.worker_id, name="test",
                                           mode="exclusive")
    upkeep = maintenance.Upkeep(runner, conn, leader=True)
    with pytest.raises(asyncpg.QueryCanceledError):
        await upkeep.run_once()
    assert (await upkeep.run_once())["pruned"] == 0 and calls == 1  # not again this minute
