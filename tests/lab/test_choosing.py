"""jobqueue.lab.choosing: the advisory-lock facts lesson 04 teaches."""

from __future__ import annotations

import asyncio
import re

import asyncpg

from jobqueue import db
from jobqueue.lab import choosing


async def test_round_trips_return_what_the_lesson_says(db_url: str) -> None:
    a, b = await db.connect(db_url), await db.connect(db_url)
    try:
        trips = await choosing.measure_round_trips(a, b, n=300)
    finally:
        await a.close()
        await b.close()
    assert all(trips.returned["try lock (free)"]) and all(trips.returned["unlock"])
    assert not any(trips.returned["try lock (held by another)"])
    assert list(choosing.latency_table(trips)["n"]) == [300, 300, 300, 300]
    assert choosing.cycles_per_second(trips) > 0
    assert choosing.medians_within(trips, 1.5)  # what lesson 04 checks on every run


def _trips(medians_us: dict[str, float], slow_us: dict[str, float], n: int = 100
           ) -> choosing.RoundTrips:
    """Round trips with a known median and a known slowest 1% per kind."""
    trips = choosing.RoundTrips()
    for kind, median in medians_us.items():
        for i in range(n):
            trips.add(kind, (slow_us[kind] if i < n // 100 + 1 else median) * 1e-6, True)
    return trips


KINDS = ("SELECT 1", "try lock (free)", "unlock", "try lock (held by another)")


def test_median_ratios_and_the_robust_check() -> None:
    trips = _trips(dict(zip(KINDS, (100, 110, 100, 90), strict=True)),
                   dict.fromkeys(KINDS, 1000.0))
    ratios = choosing.median_ratios(trips)
    assert set(ratios) == set(KINDS[1:])
    assert ratios["try lock (free)"] == 1.1 and ratios["try lock (held by another)"] == 0.9
    assert choosing.medians_within(trips, 1.15)
    assert not choosing.medians_within(trips, 1.05)


def test_latency_summary_says_what_the_figures_say() -> None:
    # The floor's tail is the longest: the summary blames the machine, not the lock.
    floor_slow = _trips(dict(zip(KINDS, (100, 102, 101, 103), strict=True)),
                        dict(zip(KINDS, (4000, 1000, 1000, 1000), strict=True)))
    text = choosing.latency_summary(floor_slow)
    assert "`SELECT 1` 100.0 µs" in text and "101.0–103.0 µs" in text
    assert "1.01–1.03× the floor" in text
    assert "In the tail they part" in text and "4.0× apart" in text
    assert "longer tail than every lock call" in text
    # The lock calls' tails are the longest: the summary says so, and claims nothing more.
    locks_slow = _trips(dict.fromkeys(KINDS, 100.0),
                        dict(zip(KINDS, (1000, 1100, 1200, 1300), strict=True)))
    text = choosing.latency_summary(locks_slow)
    assert "In the tail they stay close" in text
    assert "every lock call's tail is longer" in text and "machine's" not in text


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
    evidence = list(matrix["evidence"])
    assert not any("below" in cell for cell in evidence)  # the matrix closes the lesson
    sections = {int(n) for cell in evidence for n in re.findall(r"section (\d)", cell)}
    assert sections == {1, 2, 3, 4}  # the lesson's sections before the matrix (5)
