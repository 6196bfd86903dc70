"""The history: finished jobs move from `jobs` to `jobqueue_history`
(partitioned by status, then by day), retention drops whole days, and every
read that finds a job by id, lists finished jobs or counts them still sees
them there. Each chore is driven one tick at a time, except where a real
worker process is the point."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import uuid
from typing import Any

import asyncpg
import httpx
import pytest

from jobqueue import db
from jobqueue.control import wait
from jobqueue.ops import routing
from jobqueue.schema.queries import queries
from jobqueue.testing import wait_for
from jobqueue.worker import WorkerConfig, upkeep
from jobqueue.worker.stats import WorkerStats
from tests.conftest import run_cli

HOUR = 3600.0
DAY = 24 * HOUR
NOW_ONLY = WorkerConfig(archive_after=0, keep_completed=30 * DAY, keep_failed=30 * DAY)


async def add_jobs(conn: asyncpg.Connection, n: int, status: str, finished_ago: float | None,
                   *, job_type: str = "noop", queue: str = "default") -> list[uuid.UUID]:
    """Jobs made and finished `finished_ago` seconds ago (None: made now,
    unfinished), each with the id `jobqueue_id` would have made then: its
    first 48 bits the millisecond, as in UUIDv7."""
    return [r["id"] for r in await conn.fetch(
        "INSERT INTO jobs (id, job_type, queue, status, created_at, started_at, completed_at) "
        "SELECT CAST(lpad(to_hex(CAST(extract(epoch FROM t) * 1000 AS bigint)), 12, '0') "
        "            || '70008' || lpad(to_hex(i), 15, '0') AS uuid), "
        "       $4, $5, $1, t, now() - make_interval(secs => $2), "
        "       now() - make_interval(secs => $2) "
        "FROM generate_series(1, $3) AS i, "
        "     LATERAL (SELECT now() - make_interval(secs => coalesce($2, 0)) AS t) AS m "
        "RETURNING id",
        status, finished_ago, n, job_type, queue)]


async def where(conn: asyncpg.Connection) -> dict[str, dict[str, int]]:
    """How many jobs of each status each table holds."""
    out: dict[str, dict[str, int]] = {}
    for table in ("jobs", "jobqueue_history"):
        out[table] = {r["status"]: r["n"] for r in await conn.fetch(
            f"SELECT status, count(*) AS n FROM {table} GROUP BY status")}
    return out


async def partitions(conn: asyncpg.Connection) -> list[str]:
    return [r["relname"] for r in await conn.fetch(
        "SELECT c.relname FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid "
        "WHERE i.inhparent IN (to_regclass('jobqueue_history_completed'), "
        "                      to_regclass('jobqueue_history_failed')) ORDER BY 1")]


async def day_name(conn: asyncpg.Connection, status: str, ago: float) -> str:
    """The partition of `status` for the day (UTC) it was `ago` seconds ago,
    on the database's clock, as the jobs' completion times are."""
    day = await conn.fetchval("SELECT to_char((now() - make_interval(secs => $1)) "
                              "AT TIME ZONE 'UTC', 'YYYYMMDD')", ago)
    return f"jobqueue_history_{status}_{day}"


async def test_the_history_has_the_columns_of_jobs(conn: asyncpg.Connection) -> None:
    # `archive` moves rows with SELECT *, and the view was made with one: a
    # migration that adds a column to jobs must add it to the history too,
    # in the same place, and make the view again.
    columns = {table: [(r["attname"], r["type"]) for r in await conn.fetch(
        "SELECT attname, format_type(atttypid, atttypmod) AS type FROM pg_attribute "
        "WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        table)] for table in ("jobs", "jobqueue_history", "jobqueue_all_jobs")}
    assert len(columns["jobs"]) > 15
    assert columns["jobqueue_history"] == columns["jobqueue_all_jobs"] == columns["jobs"]


async def test_an_id_tells_the_day_its_history_can_start(conn: asyncpg.Connection) -> None:
    row = await conn.fetchrow(
        "SELECT jobqueue_id_floor(jobqueue_id()) AS ours, now() AS now, "
        "       jobqueue_id_floor(gen_random_uuid()) = '-infinity' AS other_anywhere")
    assert row["now"] - dt.timedelta(days=1, seconds=5) <= row["ours"] <= row["now"]
    assert row["other_anywhere"]


async def test_archive_moves_finished_jobs_and_deletes_those_past_retention(
    conn: asyncpg.Connection
) -> None:
    await add_jobs(conn, 3, "completed", 2 * HOUR)
    await add_jobs(conn, 2, "completed", 10)  # finished too recently to move
    await add_jobs(conn, 4, "failed", 2 * HOUR)
    await add_jobs(conn, 1, "failed", 48 * HOUR)  # past retention: deleted, not moved
    await add_jobs(conn, 1, "completed", 3 * DAY)  # past retention too
    await add_jobs(conn, 5, "pending", None)
    config = WorkerConfig(archive_after=60, keep_completed=DAY, keep_failed=DAY)
    assert (await upkeep.archive(conn, config))[0] == 9
    assert await where(conn) == {"jobs": {"completed": 2, "pending": 5},
                                 "jobqueue_history": {"completed": 3, "failed": 4}}
    assert (await upkeep.archive(conn, config))[0] == 0
    counts = await queries["history_counts"].rows(conn)
    assert {(r["status"], r["queue"], r["job_type"], r["n"]) for r in counts} == {
        ("completed", "default", "noop", 3), ("failed", "default", "noop", 4)}


async def test_a_full_slice_moves_again_next_tick(
    conn: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(upkeep, "ARCHIVE_SLICE", 2)
    await add_jobs(conn, 5, "completed", 2 * HOUR)
    chores = upkeep.Leader(NOW_ONLY, conn, 4242, WorkerStats(), asyncio.Lock())
    moved = [(await chores.run_once())["archived"] for _ in range(4)]
    assert moved == [2, 2, 1, 0] and chores.leader
    assert await where(conn) == {"jobs": {}, "jobqueue_history": {"completed": 5}}


async def test_slices_go_on_from_where_the_last_ended_and_once_a_minute_from_the_front(
    conn: asyncpg.Connection
) -> None:
    await add_jobs(conn, 2, "completed", 2 * HOUR)
    chores = upkeep.Leader(NOW_ONLY, conn, 4244, WorkerStats(), asyncio.Lock())
    assert (await chores.run_once())["archived"] == 2  # the first tick looks from the front
    # A job whose completion committed late: finished before the slice's end.
    [late] = await add_jobs(conn, 1, "completed", 3 * HOUR)
    assert (await chores.run_once())["archived"] == 0  # the slice was not full: no look yet
    chores.next_archive -= upkeep.ARCHIVE_IDLE  # seconds later: a look from the slice's end
    assert (await chores.run_once())["archived"] == 0
    assert await conn.fetchval("SELECT count(*) FROM jobs WHERE id = $1", late) == 1
    chores.last_expire -= upkeep.EXPIRE_EVERY  # a minute later: from the front
    assert (await chores.run_once())["archived"] == 1
    assert await where(conn) == {"jobs": {}, "jobqueue_history": {"completed": 3}}


async def test_each_day_gets_its_partitions_and_retention_drops_whole_days(
    conn: asyncpg.Connection
) -> None:
    await add_jobs(conn, 2, "completed", 3 * DAY)
    await add_jobs(conn, 3, "completed", 60)
    await add_jobs(conn, 1, "failed", 3 * DAY)
    assert (await upkeep.archive(conn, NOW_ONLY))[0] == 6
    made = await partitions(conn)
    # Both statuses, every day from the oldest job's to the newest's.
    assert len(made) == 8 and {await day_name(conn, "failed", 3 * DAY),
                               await day_name(conn, "completed", 60)} <= set(made)
    assert await upkeep.expire(conn, NOW_ONLY) == 0  # all within 30 days

    short = WorkerConfig(keep_completed=DAY, keep_failed=30 * DAY)
    assert await upkeep.expire(conn, short) >= 1  # completed days only
    left = await partitions(conn)
    assert await day_name(conn, "completed", 3 * DAY) not in left
    assert {await day_name(conn, "failed", 3 * DAY),
            await day_name(conn, "completed", 60)} <= set(left)
    assert await where(conn) == {"jobs": {},
                                 "jobqueue_history": {"completed": 3, "failed": 1}}
    groups, estimated = await routing.read_finished(conn)
    assert {(g.status, g.n) for g in groups} == {("completed", 3), ("failed", 1)}
    assert not estimated


async def test_a_slice_moves_nothing_past_the_window_its_days_were_made_for(
    conn: asyncpg.Connection, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(upkeep, "ARCHIVE_SLICE", 2)
    locked, taken = await add_jobs(conn, 2, "completed", 3 * DAY + 60)
    [later] = await add_jobs(conn, 1, "completed", 2 * DAY)  # a day with no partition yet
    holder = await db.connect(db_url)
    try:
        holding = holder.transaction()
        await holding.start()
        await holder.execute("SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE", locked)
        # The slice is the two oldest; one is locked (SKIP LOCKED), and the
        # job after them, of another day, does not take its place.
        assert (await upkeep.archive(conn, NOW_ONLY))[0] == 1
        assert {r["id"] for r in await conn.fetch("SELECT id FROM jobs")} == {locked, later}
        await holding.rollback()
    finally:
        await holder.close()
    assert (await upkeep.archive(conn, NOW_ONLY))[0] == 2
    assert taken and await where(conn) == {"jobs": {}, "jobqueue_history": {"completed": 3}}


async def test_a_lookup_by_id_reads_only_the_days_since_the_job_was_made(
    conn: asyncpg.Connection
) -> None:
    [old] = await add_jobs(conn, 1, "completed", 20 * DAY)
    [recent] = await add_jobs(conn, 1, "completed", 2 * HOUR)
    assert (await upkeep.archive(conn, NOW_ONLY))[0] == 2
    assert len(await partitions(conn)) >= 40  # twenty days and more, both statuses

    async def history_scans(job_id: uuid.UUID) -> int:
        plan = await conn.fetchval(
            "EXPLAIN (ANALYZE, FORMAT JSON) SELECT status FROM jobqueue_all_jobs "
            "WHERE id = $1 AND (completed_at IS NULL OR completed_at >= jobqueue_id_floor($1))",
            job_id)
        found = 0

        def walk(node: dict[str, Any]) -> None:
            nonlocal found
            found += node.get("Relation Name", "").startswith("jobqueue_history_") \
                and node.get("Actual Loops", 0) > 0
            for child in node.get("Plans", []):
                walk(child)
        walk(json.loads(plan)[0]["Plan"])
        return found

    assert (await queries["get_job"].fetchrow(conn, id=old))["status"] == "completed"
    assert 1 <= await history_scans(recent) <= 6  # its day and the day before, both statuses
    assert await history_scans(old) >= 40  # twenty days back: most of them


async def test_a_day_in_use_is_dropped_on_a_later_pass(
    conn: asyncpg.Connection, db_url: str
) -> None:
    await add_jobs(conn, 2, "completed", 3 * DAY)
    assert (await upkeep.archive(conn, NOW_ONLY))[0] == 2
    reader = await db.connect(db_url)
    try:
        reading = reader.transaction()
        await reading.start()
        assert await reader.fetchval("SELECT count(*) FROM jobqueue_history") == 2
        short = WorkerConfig(keep_completed=DAY)
        assert await upkeep.expire(conn, short) == 0  # not waited for: the reader holds it
        assert await day_name(conn, "completed", 3 * DAY) in await partitions(conn)
        await reading.commit()
        assert await upkeep.expire(conn, short) == 1
    finally:
        await reader.close()
    assert await where(conn) == {"jobs": {}, "jobqueue_history": {}}


async def test_a_finished_job_is_found_by_id_wherever_it_is(
    conn: asyncpg.Connection, client: httpx.AsyncClient, db_url: str
) -> None:
    [done] = await add_jobs(conn, 1, "completed", 2 * HOUR)
    legacy = await conn.fetchval(  # an id from before 0007: no day in it
        "INSERT INTO jobs (id, job_type, status, started_at, completed_at) "
        "VALUES (gen_random_uuid(), 'noop', 'failed', now(), now() - interval '1 hour') "
        "RETURNING id")
    await conn.execute("UPDATE jobs SET result = '{\"answer\": 42}' WHERE id = $1", done)
    assert (await upkeep.archive(conn, NOW_ONLY))[0] == 2
    assert await conn.fetchval("SELECT count(*) FROM jobs") == 0

    for job_id, status in [(done, "completed"), (legacy, "failed")]:
        assert (await queries["get_job"].fetchrow(conn, id=job_id))["status"] == status
        response = await client.get(f"/jobs/{job_id}")
        assert response.status_code == 200 and response.json()["status"] == status
        finished = await wait(job_id, timeout=10, database=db_url)
        assert finished.status == status
    assert (await wait(done, timeout=10, database=db_url)).result == {"answer": 42}
    assert (await client.get(f"/jobs/{uuid.uuid4()}")).status_code == 404

    cancelled = await client.delete(f"/jobs/{done}")
    assert cancelled.status_code == 409, cancelled.text  # finished, not "no such job"


async def test_a_failed_job_in_the_history_is_retried_back_into_the_queue(
    conn: asyncpg.Connection, client: httpx.AsyncClient
) -> None:
    [failed] = await add_jobs(conn, 1, "failed", 2 * HOUR, job_type="report")
    await add_jobs(conn, 2, "failed", 2 * HOUR, job_type="report")
    assert (await upkeep.archive(conn, NOW_ONLY))[0] == 3
    response = await client.post(f"/jobs/{failed}/retry")
    assert response.status_code == 200, response.text
    row = await conn.fetchrow("SELECT status, completed_at, run_at <= now() AS due "
                              "FROM jobs WHERE id = $1", failed)
    assert dict(row) == {"status": "pending", "completed_at": None, "due": True}
    assert await where(conn) == {"jobs": {"pending": 1}, "jobqueue_history": {"failed": 2}}
    groups, _ = await routing.read_finished(conn)
    assert [(g.status, g.n) for g in groups] == [("failed", 2)]
    again = await client.post(f"/jobs/{failed}/retry")
    assert again.status_code == 409  # pending now: nothing to retry


async def test_lists_and_counts_read_both_tables(
    conn: asyncpg.Connection, client: httpx.AsyncClient
) -> None:
    archived = await add_jobs(conn, 3, "completed", 2 * HOUR)
    assert (await upkeep.archive(conn, NOW_ONLY))[0] == 3
    recent = await add_jobs(conn, 2, "completed", 5)
    waiting = await add_jobs(conn, 1, "pending", None)

    page = (await client.get("/jobs", params={"limit": 10})).json()
    assert [j["id"] for j in page["jobs"]] == [str(i) for i in
                                               sorted(archived + recent + waiting,
                                                      reverse=True)]
    done = await queries["dashboard_completed"].rows(
        conn, queue=None, job_type=None, before_at=dt.datetime.max.replace(tzinfo=dt.UTC),
        before_id=uuid.UUID(int=2**128 - 1), limit=10)
    assert [r["id"] for r in done] == [*sorted(recent, reverse=True),
                                       *sorted(archived, reverse=True)]
    groups, estimated = await routing.read_finished(conn)
    assert [(g.status, g.n) for g in groups] == [("completed", 5)] and not estimated
    recent_finished = await queries["recent_finished"].fetchrow(conn, window=3 * HOUR)
    assert recent_finished["completed"] == 5


async def test_a_worker_moves_what_it_finished_and_status_still_finds_it(
    conn: asyncpg.Connection, spawn_worker: Any, db_url: str
) -> None:
    ids = [await conn.fetchval(
        "INSERT INTO jobs (job_type, payload) VALUES ('noop', '{}') RETURNING id")
        for _ in range(3)]
    worker = spawn_worker("--archive-after", "0")

    async def moved() -> bool:
        return await conn.fetchval(
            "SELECT count(*) FROM jobqueue_history WHERE status = 'completed'") == 3
    try:
        await wait_for(moved, timeout=30, message="the finished jobs in the history")
    finally:
        await worker.stop()
    assert await conn.fetchval("SELECT count(*) FROM jobs") == 0
    shown = run_cli("status", str(ids[0]), url=db_url)
    assert shown.returncode == 0 and "completed" in shown.stdout, shown.stderr
