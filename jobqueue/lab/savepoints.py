"""Lesson 05: savepoints and `session.begin_nested()`.

Helpers that run SQL step by step and report what PostgreSQL answered to each
step, so a notebook can show a transaction's life as a table: which statement
succeeded, which failed and with what error, and what `COMMIT` really did.
And `sql_trace` (from `jobqueue.testing`), to see the savepoints that
`begin_nested()` and jobqueue's lanes open and close.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any, NamedTuple

import asyncpg
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession

from jobqueue import lab
from jobqueue.testing import shorten
from jobqueue.testing import sql_trace as sql_trace  # the lessons call savepoints.sql_trace

# --- the demo accounts -------------------------------------------------------


async def reset_accounts(conn: asyncpg.Connection, balances: Mapping[int, int | Decimal]) -> None:
    """Empty the demo tables and open these accounts (user id → balance)."""
    await conn.execute("TRUNCATE demo_payments, demo_users")
    await conn.executemany("INSERT INTO demo_users (id, balance) VALUES ($1, $2)",
                           [(user, Decimal(balance)) for user, balance in balances.items()])


async def balances(conn: asyncpg.Connection) -> dict[int, str]:
    """Every account's balance, as text ('70.00'): exact, and printed the
    same way every run."""
    rows = await conn.fetch("SELECT id, balance FROM demo_users ORDER BY id")
    return {row["id"]: str(row["balance"]) for row in rows}


async def payments(conn: asyncpg.Connection) -> list[str]:
    """The ids of the recorded payments, sorted."""
    return [r[0] for r in await conn.fetch(
        "SELECT payment_id FROM demo_payments ORDER BY payment_id")]


# --- a transaction, step by step ---------------------------------------------


def pay(payment_id: str, user_id: int, amount: int | str) -> list[str]:
    """The two statements of a payment, as SQL text to read in a table: move
    the balance (`amount` < 0 takes money out), then record the payment, whose
    primary key makes each payment id count once."""
    value = Decimal(amount)
    sign = "-" if value < 0 else "+"
    quoted = payment_id.replace("'", "''")
    return [
        f"UPDATE demo_users SET balance = balance {sign} {abs(value)} WHERE id = {int(user_id)}",
        "INSERT INTO demo_payments (payment_id, user_id, amount) "
        f"VALUES ('{quoted}', {int(user_id)}, {value})",
    ]


class Answer(NamedTuple):
    """What PostgreSQL answered to one statement."""

    #: The command tag (`UPDATE 1`, `SAVEPOINT`, `COMMIT`…), `SELECT`, or the
    #: error's class (`CheckViolationError`…).
    answer: str
    #: For a `SELECT`: its value (`rows=True`: the first column of every row).
    value: Any
    #: The error's message, '' if none.
    message: str


async def send(conn: asyncpg.Connection, sql: str, *, rows: bool = False) -> Answer:
    """Run one statement and say what PostgreSQL answered, errors included
    (a lesson wants to see them, not stop at them)."""
    value: Any = ""
    try:
        if sql.lstrip().upper().startswith("SELECT"):
            if rows:
                value = [r[0] for r in await conn.fetch(sql)]
            else:
                value = await conn.fetchval(sql)
                value = str(value) if isinstance(value, Decimal) else value
            answer = "SELECT"
        else:
            answer = await conn.execute(sql)
    except asyncpg.PostgresError as exc:
        return Answer(type(exc).__name__, "", str(exc).splitlines()[0])
    return Answer(answer, value, "")


async def run_steps(conn: asyncpg.Connection, steps: Sequence[str]) -> Any:
    """Run each SQL statement in turn, going on after errors, and return what
    PostgreSQL answered, one row per statement:

    - `answer`: the command tag (`UPDATE 1`, `SAVEPOINT`, `COMMIT`…) or the
      error's class (`CheckViolationError`…);
    - `value`: for a `SELECT`, the value it returned;
    - `in transaction`: whether the session is inside a transaction block
      afterwards (asyncpg asks the server's ready-for-query status).

    A step that fails does not stop the run: that is the point, to see what
    the statements after a failure get.
    """
    rows = []
    for sql in steps:
        answer, value, _ = await send(conn, sql)
        rows.append({"statement": shorten(sql, 100), "answer": answer, "value": value,
                     "in transaction": conn.is_in_transaction()})
    return lab.table(rows)


# --- what SQLAlchemy sends ---------------------------------------------------

# `sql_trace` records it; it lives in jobqueue.testing (the tests use it too)
# and is named here so that the lessons find it beside the other helpers.


async def session_pay(session: AsyncSession, payment_id: str, user_id: int,
                      amount: int | str) -> None:
    """A payment through an SQLAlchemy session: the same two statements as
    `pay`, with bound parameters."""
    await session.execute(
        text("UPDATE demo_users SET balance = balance + :amount WHERE id = :user_id"),
        {"amount": Decimal(amount), "user_id": user_id})
    await session.execute(
        text("INSERT INTO demo_payments (payment_id, user_id, amount) "
             "VALUES (:payment_id, :user_id, :amount)"),
        {"payment_id": payment_id, "user_id": user_id, "amount": Decimal(amount)})


def pg_error(exc: BaseException) -> str:
    """The name of PostgreSQL's error behind an SQLAlchemy exception
    (`CheckViolationError`, …), or the exception's own class name."""
    orig = getattr(exc, "orig", None)
    for candidate in (getattr(orig, "__cause__", None), orig):
        if isinstance(candidate, asyncpg.PostgresError):
            return type(candidate).__name__
    return type(orig if orig is not None else exc).__name__


# --- a handler that swallows a database error --------------------------------


async def swallowing_payment(session: AsyncSession, payload: dict[str, Any]) -> dict[str, Any]:
    """A jobqueue handler that does it wrong: it catches the database's error
    and returns as if all went well. Its savepoint is void by then (PostgreSQL
    aborted it), so jobqueue fails the job with `SwallowedDatabaseError`
    rather than pretend. Do not write handlers like this."""
    try:
        await session_pay(session, payload["payment_id"], payload["user_id"], payload["amount"])
    except DBAPIError:
        return {"ok": True}  # the bug: the error is swallowed
    return {"ok": True}


async def job_outcomes(conn: asyncpg.Connection) -> Any:
    """The jobs of the lesson, by payment id: status, attempts, and the error
    reduced to its class (`CheckViolationError`, `SwallowedDatabaseError`…)."""
    rows = await conn.fetch(
        """SELECT payload->>'payment_id' AS payment_id, job_type, status,
                  retry_count, error_message
           FROM jobqueue_all_jobs ORDER BY payload->>'payment_id', created_at""")
    return lab.table({"payment_id": r["payment_id"], "job_type": r["job_type"],
                      "status": r["status"], "error": error_kind(r["error_message"])}
                     for r in rows)


def error_kind(message: str | None) -> str:
    """The error class a job's `error_message` names: the PostgreSQL error
    inside an SQLAlchemy message if there is one, else the leading class."""
    if not message:
        return ""
    match = re.search(r"asyncpg\.(?:exceptions\.)?(\w+Error)", message)
    if match:
        return match.group(1)
    return message.split(":", 1)[0]



# --- what a savepoint costs ----------------------------------------------------


async def payments_timed(conn: asyncpg.Connection, count: int, *, savepoints: bool) -> float:
    """Seconds for `count` one-cent top-ups of user 1 in one transaction,
    each in a savepoint of its own (SAVEPOINT, UPDATE, RELEASE: two more
    round trips) or not. Rolled back: it only measures."""
    tx = conn.transaction()
    await tx.start()
    try:
        started = time.perf_counter()
        for _ in range(count):
            if savepoints:
                await conn.execute("SAVEPOINT p")
            await conn.execute("UPDATE demo_users SET balance = balance + 0.01 WHERE id = 1")
            if savepoints:
                await conn.execute("RELEASE SAVEPOINT p")
        return time.perf_counter() - started
    finally:
        await tx.rollback()


# --- the subtransaction cache -------------------------------------------------

#: A backend's subtransaction cache, seen from another session (PostgreSQL
#: 16+): how many subtransaction ids it keeps in shared memory, and whether
#: it overflowed (more than PGPROC_MAX_CACHED_SUBXIDS, 64, were assigned).
SUBXACT = """SELECT s.subxact_count, s.subxact_overflowed
             FROM pg_stat_get_backend_idset() AS b(id),
                  pg_stat_get_backend_subxact(b.id) AS s
             WHERE pg_stat_get_backend_pid(b.id) = $1"""

#: Pages of pg_subtrans (the parent of every subtransaction id) read so far,
#: by every session: from the buffers (hit) or from disk (read).
SUBTRANS_READS = "SELECT blks_hit + blks_read FROM pg_stat_slru WHERE name = 'Subtrans'"


async def subxact(observer: asyncpg.Connection, conn: asyncpg.Connection) -> dict[str, Any]:
    """`conn`'s subtransaction cache, as `observer` sees it."""
    row = await observer.fetchrow(SUBXACT, conn.get_server_pid())
    if row is None:
        raise LookupError(f"no backend with pid {conn.get_server_pid()}")
    return {"cached subxids": row["subxact_count"], "overflowed": row["subxact_overflowed"]}


async def reset_rows(conn: asyncpg.Connection) -> None:
    """An empty table for savepoints to write into: `lesson_rows(n)`."""
    await conn.execute("CREATE TABLE IF NOT EXISTS lesson_rows (n integer)")
    await conn.execute("TRUNCATE lesson_rows")


async def open_savepoints(conn: asyncpg.Connection, count: int, *, prefix: str = "s",
                          first: int = 1, rows: int = 1, nested: bool = True,
                          write: bool = True) -> None:
    """Open savepoints `{prefix}{first}`… in `conn`'s open transaction, each
    writing `rows` rows into `lesson_rows` (write=False: each only reads).
    nested: never released, each inside the one before (as jobqueue's
    are); else released at once, each a sibling of the one before."""
    for k in range(first, first + count):
        await conn.execute(f"SAVEPOINT {prefix}{k}")
        if write:
            await conn.execute("INSERT INTO lesson_rows SELECT generate_series(1, $1)", rows)
        else:
            await conn.fetchval("SELECT count(*) FROM lesson_rows")
        if not nested:
            await conn.execute(f"RELEASE SAVEPOINT {prefix}{k}")


async def cache_by_savepoint(conn: asyncpg.Connection, observer: asyncpg.Connection,
                             marks: Sequence[int] = (1, 63, 64, 65, 70)) -> Any:
    """One transaction on `conn`, watched from `observer`: 100 savepoints
    that only read (each released: a write inside nested ones would give
    every enclosing one an id too), then savepoints that write, nested (s1,
    s2, …); the
    cache at each count in `marks`, after `ROLLBACK TO SAVEPOINT s10`, and
    after the transaction ends. One row per moment."""
    await reset_rows(conn)
    moments: list[dict[str, Any]] = []

    async def look(moment: str) -> None:
        moments.append({"moment": moment, **await subxact(observer, conn)})

    async with conn.transaction():
        await open_savepoints(conn, 100, prefix="r", write=False, nested=False)
        await look("savepoints that only read: 100")
        opened = 0
        for mark in sorted(marks):
            await open_savepoints(conn, mark - opened, first=opened + 1)
            opened = mark
            await look(f"savepoints that wrote: {opened}")
        await conn.execute("ROLLBACK TO SAVEPOINT s10")
        await look("ROLLBACK TO SAVEPOINT s10")
    await look("after COMMIT")
    return lab.table(moments).set_index("moment")


async def reader_cost(writer: asyncpg.Connection, reader: asyncpg.Connection,
                      observer: asyncpg.Connection, *, savepoints: int, rows: int = 1000,
                      nested: bool = True) -> dict[str, Any]:
    """What `writer`'s open subtransactions cost another session: `writer`
    opens `savepoints` savepoints, each writing `rows` rows, and keeps its
    transaction open; one later transaction commits (on a busy server there
    are always some); `reader` counts the table twice. How many pg_subtrans
    pages each count read, per row it looked at."""
    await reset_rows(writer)
    tx = writer.transaction()
    await tx.start()
    try:
        await open_savepoints(writer, savepoints, rows=rows, nested=nested)
        cache = await subxact(observer, writer)
        await observer.fetchval("SELECT pg_current_xact_id()")  # a transaction commits
        reads = [await _subtrans_reads(reader, observer, "SELECT count(*) FROM lesson_rows")
                 for _ in range(2)]
    finally:
        await tx.rollback()
    looked_at = savepoints * rows
    return {"savepoints": savepoints, "nested": nested, **cache, "rows written": looked_at,
            "pg_subtrans reads per row, 1st count": round(reads[0] / looked_at, 1),
            "2nd count": round(reads[1] / looked_at, 1)}


async def _subtrans_reads(reader: asyncpg.Connection, observer: asyncpg.Connection,
                          sql: str) -> int:
    """pg_subtrans pages `reader` read running `sql`. A backend sends its
    statistics in at most once a second; pg_stat_force_next_flush() makes
    it send them when the statement that asked ends. The counter is the
    server's: it is `reader`'s alone while no other session reads through
    an overflowed snapshot (none does in the lesson's database)."""
    await reader.fetchval("SELECT pg_stat_force_next_flush()")
    before = await observer.fetchval(SUBTRANS_READS)
    await reader.fetchval(sql)
    await reader.fetchval("SELECT pg_stat_force_next_flush()")
    return int(await observer.fetchval(SUBTRANS_READS) - before)


# --- locks and savepoints -----------------------------------------------------

#: The advisory locks this session holds, as `pg_locks` lists them
#: (class/key), or 'none'.
HELD_LOCKS = ("SELECT coalesce(string_agg(classid || '/' || objid, ', ' ORDER BY objid), 'none') "
              "FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()")
