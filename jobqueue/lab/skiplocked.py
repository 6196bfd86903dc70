"""Lesson 06, "SKIP LOCKED, two connections side by side": how workers share
a queue without waiting for each other, on a table small enough to read.

`lesson_jobs(id, status)` holds a few numbered jobs. A worker claims the first
pending ones with `SELECT … ORDER BY id LIMIT 2 FOR UPDATE SKIP LOCKED` inside
an open transaction; a second connection running the same statement gets the
next ones. Without `SKIP LOCKED` it waits (`start_blocked` shows it waiting,
seen from a third connection); with `NOWAIT` it fails at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from jobqueue import lab
from jobqueue.lab.savepoints import send
from jobqueue.testing import shorten, wait_for

#: The statement a worker claims with: the two first pending jobs no other
#: transaction has locked, locked for this one until it ends.
CLAIM = ("SELECT id FROM lesson_jobs WHERE status = 'pending' "
         "ORDER BY id LIMIT 2 FOR UPDATE SKIP LOCKED")
#: The same without SKIP LOCKED: it waits for rows another transaction locked.
CLAIM_OR_WAIT = CLAIM.removesuffix(" SKIP LOCKED")
#: The same with NOWAIT: it fails at once on a row another transaction locked.
CLAIM_NOWAIT = CLAIM.replace("SKIP LOCKED", "NOWAIT")


async def reset_jobs(conn: asyncpg.Connection, count: int = 6) -> list[int]:
    """A fresh `lesson_jobs` table with jobs 1..count, all pending; their ids."""
    await conn.execute("""CREATE TABLE IF NOT EXISTS lesson_jobs (
                              id integer PRIMARY KEY,
                              status text NOT NULL DEFAULT 'pending')""")
    await conn.execute("TRUNCATE lesson_jobs")
    await conn.execute("INSERT INTO lesson_jobs (id) SELECT generate_series(1, $1)", count)
    return [r[0] for r in await conn.fetch("SELECT id FROM lesson_jobs ORDER BY id")]


async def run_steps(sessions: Mapping[str, asyncpg.Connection],
                    steps: Sequence[tuple[str, str]]) -> Any:
    """Run (session, statement) steps in turn, each on its session, going on
    after errors; one row per step: who sent it, what PostgreSQL answered
    (command tag, `SELECT`, or the error's class), the ids a `SELECT`
    returned or the error's message, and whether that session is inside a
    transaction afterwards."""
    rows = []
    for who, sql in steps:
        conn = sessions[who]
        answer, value, message = await send(conn, sql, rows=True)
        rows.append({"session": who, "statement": shorten(sql, 100), "answer": answer,
                     "rows / error": message or value,
                     "in transaction": conn.is_in_transaction()})
    return lab.table(rows)


async def states(observer: asyncpg.Connection, *pids: int) -> Any:
    """What these sessions are doing, as `pg_stat_activity` and `pg_locks`
    show a third connection: state, wait event, the lock they wait for and
    whose session holds it (`pg_blocking_pids`)."""
    rows = await observer.fetch(
        """SELECT a.application_name AS session, a.state, a.wait_event_type, a.wait_event,
                  coalesce(l.locktype, '') AS waiting_for,
                  coalesce((SELECT string_agg(b.application_name, ', ')
                            FROM pg_stat_activity b
                            WHERE b.pid = ANY(pg_blocking_pids(a.pid))), '') AS blocked_by
           FROM pg_stat_activity a
           LEFT JOIN pg_locks l ON l.pid = a.pid AND NOT l.granted
           WHERE a.pid = ANY($1::int[])
           ORDER BY a.application_name""", list(pids))
    return lab.table(rows).fillna("")


@dataclass
class Blocked:
    """A statement that is waiting for a lock, started in the background:
    `await blocked.result()` once whoever holds the lock has let go."""

    task: asyncio.Task[list[int]]

    async def result(self, timeout: float = 10.0) -> list[int]:
        return await asyncio.wait_for(self.task, timeout)


async def start_blocked(conn: asyncpg.Connection, observer: asyncpg.Connection,
                        sql: str) -> Blocked:
    """Start `sql` on `conn` and return once `observer` sees it waiting for a
    lock (so what follows in the lesson happens while it waits, every run);
    fails if it finished instead of waiting."""

    async def ids() -> list[int]:
        return [r[0] for r in await conn.fetch(sql)]

    task = asyncio.create_task(ids())
    pid = conn.get_server_pid()

    async def waiting() -> bool:
        if task.done():
            raise AssertionError(f"it did not wait: {task.result()!r}")
        return bool(await observer.fetchval(
            "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", pid))

    await wait_for(waiting, message="the statement waiting for a lock")
    return Blocked(task)
