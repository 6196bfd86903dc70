"""Claims from a floor (`jobqueue/worker/floors.py`): they step over none of
the index entries of jobs already finished, and still never lose a job that
lands behind the floor.

Each test first shows that the worker's floor had passed the job (a job due
after it ran first), then that the job runs anyway, by the way the module
says it gets back in front of the floor.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from jobqueue import HandlerRegistry, JobRunner, db, enqueue, enqueue_many
from jobqueue.schema.queries import queries
from jobqueue.testing import drain, wait_for
from jobqueue.worker import book
from jobqueue.worker.completer import tid_array
from jobqueue.worker.floors import DUE_PREFIX, Floors, Place, _from_epoch
from jobqueue.worker.handler import ClaimedJob
from tests.test_worker import running

#: Long enough for a loaded machine, far below the look from the front
#: (DISCOVER_INTERVAL, 60 s), which would find any job by itself.
DEADLINE = 20.0


def registry(*idle: str) -> HandlerRegistry:
    """`noop`, and handlers for the `idle` types (no job of theirs is enqueued:
    a worker's other types, each one more arm of every claim)."""
    registry = HandlerRegistry()

    async def noop(session: AsyncSession, payload: dict[str, Any]) -> None:
        return None

    for job_type in ("noop", *idle):
        registry.register(job_type)(noop)
    return registry


@contextlib.asynccontextmanager
async def worker(db_url: str, **kw: Any) -> AsyncIterator[JobRunner]:
    runner = JobRunner(db_url, registry=registry(), install_signal_handlers=False,
                       poll_interval=0.2, **kw)
    async with running(runner):
        yield runner


async def enqueue_one(engine: AsyncEngine, **kw: Any) -> uuid.UUID:
    async with engine.begin() as s:
        return await enqueue(s, "noop", {}, **kw)


async def status(conn: asyncpg.Connection, job_id: uuid.UUID) -> str:
    return str(await conn.fetchval("SELECT status FROM jobs WHERE id = $1", job_id))


async def completed(conn: asyncpg.Connection, job_id: uuid.UUID) -> bool:
    return await status(conn, job_id) == "completed"


async def run_one_after(engine: AsyncEngine, conn: asyncpg.Connection, behind: uuid.UUID,
                        *, committed: bool = True, pending: bool = True) -> None:
    """Enqueue a job due after `behind` and wait until the worker ran it: its
    claims start past `behind` from then on. `committed`: `behind` is visible
    (else its transaction is still open); `pending`: it still waits."""
    later = await enqueue_one(engine)
    await wait_for(lambda: completed(conn, later), timeout=DEADLINE,
                   message="a job due later to run")
    row = await conn.fetchrow(
        "SELECT l.run_at > b.run_at AS after, b.status FROM jobs AS l "
        "LEFT JOIN jobs AS b ON b.id = $1 WHERE l.id = $2", behind, later)
    if committed:
        assert row["after"] and row["status"] == ("pending" if pending else "completed")
    else:
        assert row["status"] is None  # not visible yet


# -- what the claims read ---------------------------------------------------------


async def entries_read(conn: asyncpg.Connection) -> int:
    """Index entries that scans of the claim indexes have read (dead ones
    too: each costs a visit to its heap row), as the statistics have them now
    (by type, or across types: with one type waiting, the planner may read either)."""
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    return int(await conn.fetchval(
        "SELECT sum(idx_tup_read) FROM pg_stat_user_indexes "
        "WHERE indexrelname IN ('idx_jobs_pickable', 'idx_jobs_waiting')"))


@pytest.mark.parametrize("idle", [(), ("idle_a", "idle_b")], ids=["one type", "idle types"])
@pytest.mark.parametrize("quick_batch", [0.05, 0.0], ids=["taken", "claimed"])
async def test_under_a_held_horizon_claims_read_each_entry_a_few_times_not_every_time(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection, quick_batch: float,
        idle: tuple[str, ...]) -> None:
    """Vacuum held back, 2,000 jobs in batches of 10: claims from the front
    would read the entries of every job finished before them, over 200,000
    in all; from a floor, each entry a few times (the claim, and the look
    for where the next one starts). With handlers for other types that have
    no job, each claim has an arm for each of them too: those arms need a
    floor as well (issue 49: without one, each read its range from the
    front, and the planner may read it in idx_jobs_waiting, across types)."""
    n, batch = 2000, 10
    holder = await asyncpg.connect(**db.asyncpg_connect_args(db_url))
    try:
        await holder.execute("BEGIN")
        await holder.fetchval("SELECT pg_current_xact_id()")  # holds the horizon from now on
        async with engine.begin() as s:
            await enqueue_many(s, "noop", [{} for _ in range(n)])
        # Statistics, as any table that has lived a while has them: a planner
        # that believes `jobs` empty records each batch's outcome by reading
        # the whole claim index (a bitmap scan) instead of the primary key.
        await conn.execute("ANALYZE jobs")
        before = await entries_read(conn)
        report = await drain(db_url, registry=registry(*idle), batch_size=batch,
                             quick_batch=quick_batch, concurrency=1)
        assert report["processed"] == n
        # Every finished job's old version is still there: nothing was vacuumed away.
        assert await conn.fetchval(
            "SELECT count(*) FROM jobs WHERE status = 'completed'") == n
        seen: list[int] = []

        async def arrived() -> int | None:
            # The drain's backends send their counts as they close; settled
            # once two reads agree (and the claims were counted at all).
            seen.append(await entries_read(conn) - before)
            return seen[-1] if len(seen) > 1 and seen[-1] == seen[-2] >= n else None

        read = await wait_for(arrived, timeout=DEADLINE, interval=0.3,
                              message="the index statistics of the drain")
    finally:
        await holder.close()
    assert read < 6 * n, read


async def test_under_a_held_horizon_a_claimed_job_is_recorded_by_row_address(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection) -> None:
    """Issue 49: claimed jobs (as each job that arrives alone is) were
    recorded by id, through idx_jobs_processing (the worker's jobs that
    are `processing`), which keeps an entry for every job the worker claimed
    since vacuum was held back: 1,000 jobs claimed ten at a time read about
    50,000 of its entries. Recorded where `claim` wrote them, none."""
    n = 1000
    holder = await asyncpg.connect(**db.asyncpg_connect_args(db_url))
    try:
        await holder.execute("BEGIN")
        await holder.fetchval("SELECT pg_current_xact_id()")
        async with engine.begin() as s:
            await enqueue_many(s, "noop", [{} for _ in range(n)])
        await conn.execute("ANALYZE jobs")
        before = await processing_read(conn), await entries_read(conn)
        report = await drain(db_url, registry=registry(), batch_size=10, quick_batch=0.0,
                             concurrency=1)
        assert report["processed"] == n
        assert await conn.fetchval(  # claimed, every one: each had an entry there
            "SELECT count(*) FROM jobs WHERE status = 'completed' AND started_at IS NOT NULL "
            "AND started_at < completed_at") == n
        seen: list[tuple[int, int]] = []

        async def settled() -> tuple[int, int] | None:
            # The drain's backends send their counts as they close: settled
            # once two reads agree and the claims' own reads are counted.
            seen.append((await processing_read(conn) - before[0],
                         await entries_read(conn) - before[1]))
            return seen[-1] if len(seen) > 1 and seen[-1] == seen[-2] \
                and seen[-1][1] >= n else None

        read, claims_read = await wait_for(settled, timeout=DEADLINE, interval=0.3,
                                           message="the index statistics of the drain")
    finally:
        await holder.close()
    assert claims_read >= n and read < n, (read, claims_read)


async def processing_read(conn: asyncpg.Connection) -> int:
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    return int(await conn.fetchval(
        "SELECT idx_tup_read FROM pg_stat_user_indexes WHERE indexrelname = 'idx_jobs_processing'"))


# -- jobs that land behind a floor --------------------------------------------------


async def _plan_of(conn: asyncpg.Connection, name: str, values: dict[str, Any]
                   ) -> dict[str, Any]:
    query = queries[name]
    plan = await conn.fetchval("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query.positional,
                               *query.args(values))
    return dict(json.loads(plan)[0]["Plan"])


def _scans(node: dict[str, Any]) -> list[tuple[str, str]]:
    """Every scan of `jobs` in a plan: (node type, index or '')."""
    here = ([(node["Node Type"], node.get("Index Name", ""))]
            if node.get("Relation Name") == "jobs" and node["Node Type"] != "ModifyTable"
            else [])
    return here + [scan for child in node.get("Plans", []) for scan in _scans(child)]


async def test_under_a_held_horizon_a_taken_batch_is_recorded_by_row_address(
        conn: asyncpg.Connection, db_url: str) -> None:
    """150,000 jobs taken and completed in batches of 1,000 while vacuum is held
    back, statistics fresh: recording the next batch by id goes through
    idx_jobs_pickable (whose dead entries the statistics do not count) or all
    of the table; by where `take` found the rows, one heap fetch a job."""
    holder = await asyncpg.connect(**db.asyncpg_connect_args(db_url))
    take = {"queue": "default", "arm_types": ["noop"], "limit": 1000, "priorities": [0],
            "floors": [None], "floor_ids": [None]}
    try:
        await holder.execute("BEGIN")
        await holder.fetchval("SELECT pg_current_xact_id()")
        for last in [False] * 150 + [True]:
            await conn.execute("INSERT INTO jobs (job_type, payload) "
                               "SELECT 'noop', '{}' FROM generate_series(1, 1000)")
            if last:
                await conn.execute("ANALYZE jobs")
            async with conn.transaction():
                rows = await queries["take"].fetch(conn, **take)
                ids = [row["id"] for row in rows]
                values = {"ids": ids, "results": [None] * len(ids), "worker_id": 1}
                if not last:
                    await queries["complete"].fetch(conn, **values, taken=True)
                    continue
                by_tid = await _plan_of(conn, "complete_taken",
                                        {**values,
                                         "tids": tid_array(row["tid"] for row in rows)})
                # (Planned only: EXPLAIN ANALYZE above did record the batch.)
                by_id = await _plan_of(conn, "complete", {**values, "taken": True})
                raise _RolledBack
    except _RolledBack:
        pass
    finally:
        await holder.close()
    assert len(ids) == 1000
    # What there was to avoid: by id, the planner reads the jobs another way.
    assert not all(kind == "Index Scan" and index == "pk_jobs"
                   for kind, index in _scans(by_id)), _scans(by_id)
    assert _scans(by_tid) == [("Tid Scan", "")]
    assert _found(by_tid) == 1000  # one per job, each where it was


def _found(node: dict[str, Any]) -> int:
    """Rows the plan's scans of `jobs` returned, over all their loops."""
    here = (node["Actual Rows"] * node["Actual Loops"]
            if node.get("Relation Name") == "jobs" and node["Node Type"] != "ModifyTable" else 0)
    return int(here) + sum(_found(child) for child in node.get("Plans", []))


class _RolledBack(Exception):
    """Leaves the transaction that explained the last batch without recording it."""


async def test_a_job_whose_transaction_began_before_the_jobs_taken_since_is_run(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection) -> None:
    """Enqueued in a transaction that stays open while later jobs run: its
    run_at (the transaction's start) is behind the floor when it commits;
    the insert's announcement brings the floor back."""
    async with worker(db_url):
        async with AsyncSession(engine) as session, session.begin():
            early = await enqueue(session, "noop", {})
            await run_one_after(engine, conn, early, committed=False)
        await wait_for(lambda: completed(conn, early), timeout=DEADLINE,
                       message="the job committed behind the floor to run")


async def test_without_its_announcement_a_job_behind_the_floor_waits_until_told(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection) -> None:
    """The same job inserted with triggers off (session_replication_role
    replica) says nothing: the worker runs a later job and leaves it; the
    announcement, sent by hand, is what brings it in. (One lane: a lane
    that has not claimed yet has no floor and reads from the front.)"""
    async with worker(db_url, concurrency=1):
        inserter = await asyncpg.connect(**db.asyncpg_connect_args(db_url))
        try:
            await inserter.execute("SET session_replication_role = replica")
            async with inserter.transaction():
                early = await inserter.fetchval(
                    "INSERT INTO jobs (job_type) VALUES ('noop') RETURNING id")
                await run_one_after(engine, conn, early, committed=False)
            await run_one_after(engine, conn, early)  # committed, and still left behind
            await inserter.execute(
                "SELECT jobqueue_announce(queue, priority, run_at) FROM jobs WHERE id = $1",
                early)
        finally:
            await inserter.close()
        await wait_for(lambda: completed(conn, early), timeout=DEADLINE,
                       message="the announced job to run")


async def test_a_job_a_claim_passed_while_someone_held_its_lock_is_run_once_free(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection) -> None:
    """A caller of wait() reads its job with a lock; a claim at that moment
    skips it and takes the next. The floor a claim returns stops at the first
    job it did not take, locked or not, so the next claim finds it."""
    async with worker(db_url):
        held = await enqueue_one(engine)
        await wait_for(lambda: completed(conn, held), timeout=DEADLINE)  # the worker is up
        locked = await enqueue_one(engine, run_at=dt.datetime.now(dt.UTC)
                                   + dt.timedelta(seconds=2))
        reader = await asyncpg.connect(**db.asyncpg_connect_args(db_url))
        try:
            async with reader.transaction():
                await queries["wait_check"].fetchrow(reader, job_id=locked)
                await wait_for(lambda: conn.fetchval(
                    "SELECT run_at <= now() FROM jobs WHERE id = $1", locked),
                    timeout=DEADLINE, message="the locked job to be due")
                await run_one_after(engine, conn, locked)
        finally:
            await reader.close()
        await wait_for(lambda: completed(conn, locked), timeout=DEADLINE,
                       message="the job, once its lock is released, to run")


@pytest.mark.parametrize("triggers", [True, False], ids=["announced", "silent"])
async def test_a_job_set_back_to_pending_by_hand_is_run_again(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection,
        monkeypatch: pytest.MonkeyPatch, triggers: bool) -> None:
    """An UPDATE that makes a finished job waiting and due again fires the
    row trigger, which says where it waits. With triggers off it says
    nothing; then the worker's look from the front (every DISCOVER_INTERVAL,
    here a second) finds it and lowers the floor. (One lane, as above.)"""
    if not triggers:
        monkeypatch.setattr(book, "DISCOVER_INTERVAL", 1.0)
    async with worker(db_url, concurrency=1):
        first = await enqueue_one(engine)
        await wait_for(lambda: completed(conn, first), timeout=DEADLINE)
        await run_one_after(engine, conn, first, pending=False)
        async with conn.transaction():
            if not triggers:
                await conn.execute("SET LOCAL session_replication_role = replica")
            await conn.execute("UPDATE jobs SET status = 'pending', completed_at = NULL "
                               "WHERE id = $1", first)
        await wait_for(lambda: completed(conn, first), timeout=DEADLINE,
                       message="the job set back by hand to run again")


async def test_a_new_priority_is_claimed_first_as_soon_as_it_is_announced(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection) -> None:
    """A priority the worker had not seen is a new arm of its claims."""
    async with worker(db_url, concurrency=1):
        low = await enqueue_one(engine)
        await wait_for(lambda: completed(conn, low), timeout=DEADLINE)
        async with engine.begin() as s:  # one transaction: both visible at once
            later = await enqueue(s, "noop", {})
            urgent = await enqueue(s, "noop", {}, priority=5)
        await wait_for(lambda: completed(conn, later), timeout=DEADLINE)
        order = await conn.fetchval(
            "SELECT array_agg(id ORDER BY completed_at) FROM jobs WHERE id = ANY($1)",
            [later, urgent])
    assert order == [urgent, later]


# -- the floors' own bookkeeping ----------------------------------------------------


def test_an_announced_time_is_read_to_the_microsecond() -> None:
    at = dt.datetime(2026, 12, 2, 6, 30, 1, 999999, tzinfo=dt.UTC)
    assert _from_epoch(f"{at.timestamp():.6f}") == at
    assert _from_epoch("1764657001.5") == dt.datetime(2025, 12, 2, 6, 30, 1, 500000,
                                                      tzinfo=dt.UTC)
    assert _from_epoch("-1.25") == dt.datetime(1969, 12, 31, 23, 59, 58, 750000,
                                               tzinfo=dt.UTC)


def test_an_announcement_lowers_every_lane_and_one_during_a_claim_is_not_lost() -> None:
    floors = Floors()
    t0 = dt.datetime(2026, 12, 2, tzinfo=dt.UTC)
    floors.learn("q", 0)

    class Row:
        def __init__(self, floor: dt.datetime) -> None:
            self.job_type, self.priority, self.floor, self.floor_id = "t", 0, floor, None

    for lane in (0, 1):
        floors.arms(lane, "q", ["t"])
        floors.advance(lane, "q", [Row(t0 + dt.timedelta(seconds=10))])
    assert floors.heard(f"{DUE_PREFIX}0:{(t0 + dt.timedelta(seconds=4)).timestamp()}:q")
    assert [floors.arms(lane, "q", ["t"]).floors for lane in (0, 1)] == [
        [t0 + dt.timedelta(seconds=4)]] * 2
    # Lane 0 claims; a job behind its floor is announced before the claim's
    # rows come back: the floor they bring must not pass it.
    floors.arms(0, "q", ["t"])
    floors.heard(f"{DUE_PREFIX}0:{(t0 + dt.timedelta(seconds=6)).timestamp()}:q:with:colons")
    floors.heard(f"{DUE_PREFIX}0:{(t0 + dt.timedelta(seconds=5)).timestamp()}:q")
    floors.advance(0, "q", [Row(t0 + dt.timedelta(seconds=20))])
    assert floors.arms(0, "q", ["t"]).floors == [t0 + dt.timedelta(seconds=5)]
    assert floors.groups == {"q": {0}, "q:with:colons": {0}}
    # However many jobs are announced ahead of it while a claim is on its
    # way (500 a second is a busy queue's normal), the claim's floor stands.
    floors.arms(1, "q", ["t"])
    for k in range(200):
        floors.heard(f"{DUE_PREFIX}0:{(t0 + dt.timedelta(seconds=30 + k)).timestamp()}:q")
    floors.advance(1, "q", [Row(t0 + dt.timedelta(seconds=25))])
    assert floors.arms(1, "q", ["t"]).floors == [t0 + dt.timedelta(seconds=25)]
    assert not floors.heard("due:x:y:q") and not floors.heard("")


def test_the_type_waiting_longest_leads_within_a_priority_and_floors_stay_apart() -> None:
    floors = Floors(["a", "b"])
    t0 = dt.datetime(2026, 12, 6, tzinfo=dt.UTC)
    floors.learn("q", 1)
    floors.learn("q", 0)
    first = floors.arms(0, "q", ["a", "b"])
    # Priorities highest first, always; within one, types the worker knows
    # nothing of in the order the lane has them...
    assert list(zip(first.priorities, first.arm_types, strict=True)) == [
        (1, "a"), (1, "b"), (0, "a"), (0, "b")]

    class Row:
        def __init__(self, job_type: str, floor: dt.datetime) -> None:
            self.job_type, self.priority, self.floor, self.floor_id = job_type, 0, floor, None

    floors.advance(0, "q", [Row("a", t0 + dt.timedelta(seconds=20)),
                            Row("b", t0 + dt.timedelta(seconds=10))])
    # ...the one whose floor is oldest first: its next job has waited longest.
    assert floors.arms(0, "q", ["a", "b"]).arm_types[2:] == ["b", "a"]
    # Where the lane has no floor, where the last look found the first job
    # counts; a type found nowhere comes last.
    floors.seen([{"queue": "q", "job_type": "c", "priority": 0,
                  "run_at": t0 + dt.timedelta(seconds=15)}])
    assert floors.arms(0, "q", ["d", "a", "b", "c"]).arm_types[4:] == ["b", "c", "a", "d"]
    # What a look from the front found for one type lowers that type only...
    floors.discovered([{"queue": "q", "job_type": "a", "priority": 0,
                        "run_at": t0 + dt.timedelta(seconds=5)}])
    arms = floors.arms(0, "q", ["a", "b"])
    assert list(zip(arms.arm_types[2:], arms.floors[2:], strict=True)) == [
        ("a", t0 + dt.timedelta(seconds=5)), ("b", t0 + dt.timedelta(seconds=10))]
    # ...and an announcement, which names no type, lowers both.
    floors.heard(f"{DUE_PREFIX}0:{(t0 + dt.timedelta(seconds=1)).timestamp()}:q")
    assert floors.arms(0, "q", ["a", "b"]).floors[2:] == [t0 + dt.timedelta(seconds=1)] * 2
    # A lane that takes only "a" (the sync lane, say) has no say in where
    # "b" is looked for: it has no floor there, and never will.
    floors.arms(1, "q", ["a"])
    floors.advance(1, "q", [Row("a", t0 + dt.timedelta(seconds=30))])
    low = floors.lowest()
    assert {t: f for t, p, f in zip(low["arm_types"], low["priorities"], low["floors"],
                                    strict=True) if p == 0} == {
        "a": t0 + dt.timedelta(seconds=1), "b": t0 + dt.timedelta(seconds=1)}


def test_an_arm_that_took_nothing_is_read_from_its_floor_but_ordered_as_one_without() -> None:
    """Issue 49: the floor an empty arm says goes into the next claim (else
    the arm reads its range from the front), yet it tells nothing of a job
    waiting there, so within a priority it comes after the types the lane
    took from, as a type with no floor did."""
    floors = Floors(["a", "b"])
    t0 = dt.datetime(2026, 12, 6, tzinfo=dt.UTC)
    floors.learn("q", 0)
    floors.arms(0, "q", ["b", "a"])
    taken = ClaimedJob(uuid.uuid4(), "a", "{}", 0, 0, None, 0, 0, t0 + dt.timedelta(seconds=20),
                       None, None)
    floors.advance(0, "q", [taken, Place("b", 0, t0 + dt.timedelta(seconds=10), None)])
    arms = floors.arms(0, "q", ["b", "a"])
    assert list(zip(arms.arm_types, arms.floors, strict=True)) == [
        ("a", t0 + dt.timedelta(seconds=20)), ("b", t0 + dt.timedelta(seconds=10))]
    # An empty claim later says where both start; "a" stays a type it took from.
    floors.advance(0, "q", [Place("a", 0, t0 + dt.timedelta(seconds=30), None),
                            Place("b", 0, t0 + dt.timedelta(seconds=30), None)])
    assert floors.arms(0, "q", ["b", "a"]).arm_types == ["a", "b"]
    # Once "b" gives a job, its floor orders it like any other.
    floors.advance(0, "q", [taken._replace(job_type="b", floor=t0 + dt.timedelta(seconds=25))])
    assert floors.arms(0, "q", ["a", "b"]).arm_types == ["b", "a"]


async def test_a_claim_reads_none_of_the_jobs_of_types_it_cannot_run(
        conn: asyncpg.Connection, db_url: str) -> None:
    """20,000 jobs of another service's type wait in front of this worker's
    five: the take reads its five and a handful of index pages, not the
    20,000 rows it would otherwise visit to learn their type."""
    await conn.execute("INSERT INTO jobs (job_type, payload, run_at) "
                       "SELECT 'foreign', '{}', now() - interval '1 hour' "
                       "FROM generate_series(1, 20000)")
    await conn.execute("INSERT INTO jobs (job_type, payload) "
                       "SELECT 'noop', '{}' FROM generate_series(1, 5)")
    await conn.execute("VACUUM ANALYZE jobs")
    take = {"queue": "default", "arm_types": ["noop"], "limit": 1000, "priorities": [0],
            "floors": [None], "floor_ids": [None]}
    async with conn.transaction():
        plan = await _plan_of(conn, "take", take)
        assert await conn.fetchval("SELECT count(*) FROM jobs WHERE job_type = 'foreign' "
                                   "AND status = 'pending'") == 20_000  # there they are
    assert _found(plan) >= 5
    assert plan["Shared Hit Blocks"] + plan["Shared Read Blocks"] < 50, plan


async def test_a_worker_drains_its_jobs_beside_a_backlog_it_cannot_run(
        engine: AsyncEngine, conn: asyncpg.Connection, db_url: str) -> None:
    await conn.execute("INSERT INTO jobs (job_type, payload, queue) "
                       "SELECT 'foreign', '{}', 'q' || (g % 3) FROM generate_series(1, 30000) g")
    await conn.execute("INSERT INTO jobs (job_type, payload, queue) "
                       "SELECT 'foreign', '{}', 'default' FROM generate_series(1, 10000)")
    async with engine.begin() as s:
        ids = await enqueue_many(s, "noop", [{} for _ in range(500)])
    async with worker(db_url):
        await wait_for(lambda: _all_completed(conn, ids), timeout=DEADLINE,
                       message="the worker's own jobs to complete")
    assert await conn.fetchval("SELECT count(*) FROM jobs WHERE job_type = 'foreign' "
                               "AND status = 'pending'") == 40_000  # untouched


async def _all_completed(conn: asyncpg.Connection, ids: list[uuid.UUID]) -> bool:
    return await conn.fetchval("SELECT count(*) FROM jobs WHERE id = ANY($1) "
                               "AND status = 'completed'", ids) == len(ids)
