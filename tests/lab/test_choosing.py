"""jobqueue.lab.choosing: the advisory-lock facts lesson 04 teaches."""

from __future__ import annotations

import asyncio

import asyncpg

from jobqueue import db
from jobqueue.lab import choosing


async def test_round_trips_return_what_the_lesson_says(db_url: str) -> None:
    a, b = await db.connect(db_url), await db.connect(db_url)
    try:
        trips = await choosing.measure_round_trips(a, b, n=20)
    finally:
        await a.close()
        await b.close()
    assert all(trips.returned["try lock (free)"]) and all(trips.returned["unlock"])
    assert not any(trips.returned["try lock (held by another)"])
    assert list(choosing.latency_table(trips)["n"]) == [20, 20, 20, 20]
    assert choosing.cycles_per_second(trips) > 0


async def test_waiters_get_the_lock_in_arrival_order(db_url: str) -> None:
    conns = {label: await db.connect(db_url, application_name=f"lab {label}")
             for label in "ABCD"}
    try:
        waiters = {label: conns[label] for label in "DBC"}  # not alphabetical
        pending = await choosing.queue_up(conns["A"], waiters)
        locks = await choosing.advisory_locks(conns["A"])
        assert list(zip(locks["session"], locks["granted"], strict=True)) == [
            ("A", True), ("D", False), ("B", False), ("C", False)]
        assert await choosing.hand_over(conns["A"], waiters, pending) == ["D", "B", "C"]
    finally:
        for c in conns.values():
            await c.close()


async def test_a_killed_holders_lock_and_open_work_vanish(
    db_url: str, conn: asyncpg.Connection
) -> None:
    holder = await choosing.start_lock_holder(db_url)
    try:
        assert await choosing.try_lock(conn) is False
        takeover = await choosing.kill_and_take_over(holder, conn, deadline=5)
        assert takeover.acquired and takeover.seconds < 5
        assert not await choosing.backend_alive(conn, holder.backend_pid)
        assert await conn.fetchval("SELECT count(*) FROM demo_users WHERE id = 99") == 0
        assert await choosing.unlock(conn)
    finally:
        await holder.close()


async def test_a_frozen_holder_keeps_the_lock_until_terminated(
    db_url: str, conn: asyncpg.Connection
) -> None:
    holder = await choosing.start_lock_holder(db_url, "frozen")
    try:
        holder.stop()
        assert not (await choosing.wait_for_lock(conn, deadline=0.2)).acquired
        assert await choosing.terminate_backend(conn, holder.backend_pid)
        assert (await choosing.wait_for_lock(conn, deadline=5)).acquired
    finally:
        await holder.close()
    assert holder.proc.returncode is not None


async def test_reentrant_locks_count(db_url: str) -> None:
    a, b = await db.connect(db_url), await db.connect(db_url)
    try:
        assert await choosing.other_session_can_lock(a, b, locks=2, unlocks=1) is False
        assert await choosing.other_session_can_lock(a, b, locks=2, unlocks=2) is True
        await asyncio.sleep(0)
    finally:
        await a.close()
        await b.close()


def test_decision_matrix_says_where_each_answer_comes_from() -> None:
    matrix = choosing.decision_matrix()
    assert list(matrix.columns) == list(choosing.MATRIX_COLUMNS)
    assert {"holder dies (crash)", "fencing tokens", "visibility"} <= set(matrix.index)
    assert matrix.notna().all().all()
