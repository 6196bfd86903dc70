"""jobqueue.lab.skiplocked: what lesson 06's SKIP LOCKED section shows, on two
real connections (and a third that watches)."""

from __future__ import annotations

import asyncpg
import pytest

from jobqueue import db
from jobqueue.lab import skiplocked


@pytest.fixture
async def sessions(db_url: str):  # type: ignore[no-untyped-def]
    conns = {name: await db.connect(db_url, application_name=f"lab {name}")
             for name in ("A", "B", "C")}
    await skiplocked.reset_jobs(conns["A"], 6)
    yield conns
    for c in conns.values():
        c.terminate()


def column(frame, name: str) -> list:  # type: ignore[no-untyped-def]
    return list(frame[name])


async def test_skip_locked_gives_the_next_rows_nowait_and_timeout_fail(sessions) -> None:
    steps = await skiplocked.run_steps(sessions, [
        ("A", "BEGIN"), ("A", skiplocked.CLAIM), ("B", "BEGIN"), ("B", skiplocked.CLAIM),
        ("B", "SELECT id FROM lesson_jobs ORDER BY id"), ("B", "ROLLBACK"),
        ("B", skiplocked.CLAIM_NOWAIT), ("B", "SET lock_timeout = '50ms'"),
        ("B", skiplocked.CLAIM_OR_WAIT), ("A", "ROLLBACK"), ("B", skiplocked.CLAIM)])
    assert column(steps, "rows / error") == [
        "", [1, 2], "", [3, 4], [1, 2, 3, 4, 5, 6], "",
        'could not obtain lock on row in relation "lesson_jobs"', "",
        "canceling statement due to lock timeout", "", [1, 2]]
    assert column(steps, "answer")[6] == column(steps, "answer")[8] == "LockNotAvailableError"


async def test_without_skip_locked_a_claimer_waits_for_the_holder(sessions) -> None:
    a, b, c = sessions["A"], sessions["B"], sessions["C"]
    await skiplocked.run_steps(sessions, [("A", "BEGIN"), ("A", skiplocked.CLAIM)])
    waiting = await skiplocked.start_blocked(b, c, skiplocked.CLAIM_OR_WAIT)
    seen = await skiplocked.states(c, a.get_server_pid(), b.get_server_pid())
    assert column(seen, "session") == ["lab A", "lab B"]
    assert column(seen, "state") == ["idle in transaction", "active"]
    assert column(seen, "wait_event")[1] == "transactionid"
    assert column(seen, "blocked_by") == ["", "lab A"]
    assert not waiting.task.done()
    await a.execute("UPDATE lesson_jobs SET status = 'done' WHERE id IN (1, 2)")
    await a.execute("COMMIT")
    assert await waiting.result() == [3, 4]  # re-checked after the wait: 1 and 2 are done


async def test_start_blocked_fails_when_nothing_blocks(sessions) -> None:
    with pytest.raises(AssertionError, match="did not wait"):
        await skiplocked.start_blocked(sessions["B"], sessions["C"], skiplocked.CLAIM)


async def test_reset_jobs_starts_over(sessions) -> None:
    a: asyncpg.Connection = sessions["A"]
    await a.execute("UPDATE lesson_jobs SET status = 'done'")
    assert await skiplocked.reset_jobs(a, 3) == [1, 2, 3]
    assert await a.fetchval("SELECT count(*) FROM lesson_jobs WHERE status = 'pending'") == 3
