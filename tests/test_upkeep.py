"""Upkeep: heartbeat and fencing apart from the leader's rescue and history,
each driven one tick at a time with a config and a connection, no runner."""

from __future__ import annotations

import asyncio
import json
import time

import asyncpg
import pytest

from jobqueue import db
from jobqueue.schema.locks import WORKER_LOCK_CLASS
from jobqueue.schema.queries import queries
from jobqueue.testing import wait_for
from jobqueue.worker import WorkerConfig, upkeep
from jobqueue.worker.stats import WorkerStats


async def by_status(conn: asyncpg.Connection) -> dict[str, int]:
    return {r["status"]: r["n"] for r in await conn.fetch(
        "SELECT status, count(*) AS n FROM jobs GROUP BY status")}


async def register(conn: asyncpg.Connection, worker_id: int) -> None:
    await queries["register_worker"].fetch(conn, id=worker_id, name="test", mode="exclusive",
                                     queues=None, job_types=[])


def leader(config: WorkerConfig, conn: asyncpg.Connection, worker_id: int) -> upkeep.Leader:
    return upkeep.Leader(config, conn, worker_id, WorkerStats(), asyncio.Lock())


def heartbeat(config: WorkerConfig, conn: asyncpg.Connection, worker_id: int
              ) -> upkeep.Heartbeat:
    return upkeep.Heartbeat(config, conn, worker_id, lambda: "active", WorkerStats())


async def test_a_failing_expire_waits_its_minute_like_any_other(
    conn: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = 0

    async def broken(*args: object) -> int:
        nonlocal calls
        calls += 1
        raise asyncpg.QueryCanceledError("canceling statement due to statement timeout")

    monkeypatch.setattr(upkeep, "expire", broken)
    chores = leader(WorkerConfig(), conn, 4243)
    assert (await chores.run_once())["expired"] == 0 and calls == 1  # logged, not raised
    assert (await chores.run_once())["expired"] == 0 and calls == 1  # not again this minute


async def test_a_failing_move_holds_up_neither_retention_nor_the_next_ticks(
    conn: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    moves, expires = 0, 0

    async def broken(*args: object) -> tuple[int, None]:
        nonlocal moves
        moves += 1
        raise asyncpg.QueryCanceledError("canceling statement due to statement timeout")

    async def expire(*args: object) -> int:
        nonlocal expires
        expires += 1
        return 0

    monkeypatch.setattr(upkeep, "archive", broken)
    monkeypatch.setattr(upkeep, "expire", expire)
    chores = leader(WorkerConfig(), conn, 4245)
    assert (await chores.run_once())["archived"] == 0
    assert moves == 1 and expires == 1  # retention ran all the same
    await chores.run_once()
    assert moves == 1  # the failed look waits its turn, not tried again every tick
    chores.next_archive -= upkeep.ARCHIVE_IDLE
    await chores.run_once()
    assert moves == 2 and expires == 1  # a minute has not passed: no retention pass


async def test_only_one_leader_does_the_chores(conn: asyncpg.Connection, db_url: str) -> None:
    other = await db.connect(db_url)
    try:
        first, second = leader(WorkerConfig(), conn, 1), leader(WorkerConfig(), other, 2)
        assert (await first.run_once())["leader"]
        assert not (await second.run_once())["leader"]
    finally:
        await other.close()


async def test_a_heartbeat_without_its_row_means_this_worker_was_fenced(
    conn: asyncpg.Connection
) -> None:
    await register(conn, 51)
    beat = heartbeat(WorkerConfig(), conn, 51)
    assert await beat.run_once() == {"fenced": [], "rescued": 0}
    assert await conn.fetchval("SELECT state FROM jobqueue_workers WHERE id = 51") == "active"
    await conn.execute("DELETE FROM jobqueue_workers WHERE id = 51")
    with pytest.raises(upkeep.Fenced):
        await beat.run_once()


async def test_a_hung_worker_is_fenced_and_its_jobs_rescued(
    conn: asyncpg.Connection, db_url: str
) -> None:
    hung = await db.connect(db_url, application_name="jobqueue worker 77 active test")
    try:
        assert await queries["lock_worker"].fetchval(hung, lock_class=WORKER_LOCK_CLASS,
                                                     worker_id=77)
        await register(conn, 77)
        await conn.execute("UPDATE jobqueue_workers SET heartbeat_at = now() - interval '1 hour'"
                           " WHERE id = 77")
        await conn.execute("INSERT INTO jobs (job_type, status, worker_id, started_at)"
                           " VALUES ('noop', 'processing', 77, now())")
        await register(conn, 78)
        result = await heartbeat(WorkerConfig(lease=5.0), conn, 78).run_once()
        assert result["fenced"] == [(77, 1)]
        await wait_for(lambda: conn.fetchval(
            "SELECT count(*) = 0 FROM pg_stat_activity WHERE application_name LIKE "
            "'jobqueue worker 77 %' AND datname = current_database()"),
            message="the hung worker's connection to be gone")
        # Rescued at once if its backend was gone already, else by the next rescue.
        assert result["rescued"] + await upkeep.rescue(conn) == 1
        # It was all the hung worker ran: that attempt counts, as a crash's would.
        assert await by_status(conn) == {"retrying": 1}
        assert await conn.fetchval("SELECT error_message FROM jobs") == (
            "its worker (id 77) died while running it")
    finally:
        if not hung.is_closed():
            hung.terminate()


async def test_a_leader_chore_stuck_behind_a_lock_gives_up_within_the_lease_and_never_delays_the_heartbeat(  # noqa: E501
    conn: asyncpg.Connection, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = WorkerConfig(lease=2.0)
    assert config.statement_timeout < config.lease
    await register(conn, 90)
    alive = await db.connect(db_url, application_name="jobqueue worker 90 active test")
    assert await queries["lock_worker"].fetchval(alive, lock_class=WORKER_LOCK_CLASS,
                                                 worker_id=90)  # or `reap` ends the others
    monitor = await upkeep.connect(db_url, "jobqueue worker 90 monitor test", config)
    beating = await upkeep.connect(db_url, "jobqueue worker 90 heartbeat test", config)
    blocker = await db.connect(db_url)
    try:
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
        chores = leader(config, monitor, 90)
        started = time.monotonic()
        stuck = asyncio.create_task(chores.run_once())  # its rescue waits for the lock
        assert await heartbeat(config, beating, 90).run_once() == {"fenced": [], "rescued": 0}
        assert not stuck.done()  # the heartbeat went through while the chore waits
        with pytest.raises(asyncpg.QueryCanceledError):
            await stuck
        assert time.monotonic() - started < config.lease
        # In the loop, a timeout is logged and the next tick tries again.
        loop = asyncio.create_task(chores.run_forever())
        await wait_for(lambda: "upkeep failed" in caplog.text, timeout=10,
                       message="the loop to log the timeout")
        assert not loop.done()
        loop.cancel()
        await tx.rollback()
    finally:
        for c in (blocker, monitor, beating, alive):
            c.terminate()


def test_a_canceled_statement_is_not_a_lost_connection() -> None:
    """A statement timeout ends the statement, not the connection: upkeep
    and lanes carry on with it instead of starting the worker over."""
    from jobqueue.errors import is_connection_error

    assert not is_connection_error(asyncpg.QueryCanceledError("canceling statement"))
    assert is_connection_error(asyncpg.AdminShutdownError("terminating connection"))


async def test_under_a_held_horizon_the_rescue_reads_only_the_ledger_of_the_gone(
        conn: asyncpg.Connection, db_url: str) -> None:
    """A live worker's lane has written 20,000 batches to the ledger (each row
    replacing the last, as `record_batch` does) while vacuum was held back:
    the rescue still finds and settles the one row of a worker that is gone,
    and reads a few pages, not the ledger's dead versions."""
    live = await asyncpg.connect(**db.asyncpg_connect_args(db_url))
    holder = await asyncpg.connect(**db.asyncpg_connect_args(db_url))
    try:
        await live.execute("SELECT pg_advisory_lock($1, 7)", WORKER_LOCK_CLASS)  # worker 7 lives
        await holder.execute("BEGIN")
        await holder.fetchval("SELECT pg_current_xact_id()")
        await conn.execute("""
            DO $$ DECLARE previous tid; BEGIN
              FOR i IN 1..20000 LOOP
                DELETE FROM jobqueue_batches WHERE ctid = previous;
                INSERT INTO jobqueue_batches (worker_id, lane, xid, job_ids)
                VALUES (7, 0, i, '{}') RETURNING ctid INTO previous;
              END LOOP;
            END $$""")
        tx = conn.transaction()  # worker 5's last batch, which never committed
        await tx.start()
        aborted = int(await conn.fetchval(
            "SELECT CAST(CAST(pg_current_xact_id() AS text) AS bigint)"))
        await tx.rollback()
        await conn.execute("INSERT INTO jobqueue_batches (worker_id, lane, xid, job_ids) "
                           "VALUES (5, 0, $1, '{}')", aborted)
        pages = await conn.fetchval("SELECT pg_relation_size('jobqueue_batches') / 8192")
        assert pages > 100  # the dead versions are there to be stepped over
        rescue = queries["rescue"]
        plan = await conn.fetchval(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + rescue.positional,
            *rescue.args({"worker_lock_class": WORKER_LOCK_CLASS, "base": 1.0, "factor": 2.0,
                          "cap": 60.0}))
        top = json.loads(plan)[0]["Plan"]
        left = {r["worker_id"] for r in await conn.fetch("SELECT worker_id FROM jobqueue_batches")}
    finally:
        await holder.close()
        await live.close()
    assert left == {7}  # worker 5's row settled, the live worker's kept
    assert top["Shared Hit Blocks"] + top.get("Shared Read Blocks", 0) < 60, top
