"""Lesson 05: savepoints and `session.begin_nested()`.

Helpers that run SQL step by step and report what PostgreSQL answered to each
step, so a notebook can show a transaction's life as a table: which statement
succeeded, which failed and with what error, and what `COMMIT` really did.
And `sql_trace` (from `jobqueue.testing`), to see the savepoints that
`begin_nested()` and jobqueue's lanes open and close.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

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
        value: Any = ""
        try:
            if sql.lstrip().upper().startswith("SELECT"):
                value = await conn.fetchval(sql)
                answer = "SELECT"
                value = str(value) if isinstance(value, Decimal) else value
            else:
                answer = await conn.execute(sql)
        except asyncpg.PostgresError as exc:
            answer = type(exc).__name__
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
           FROM jobs ORDER BY payload->>'payment_id', created_at""")
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
