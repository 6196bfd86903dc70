"""Handlers whose statements fail with a card number and an API key among
their values, in each form a handler takes (`--import tests.secret_handlers`,
for `test_secrets.py`): async and sync sessions, a connection of the
handler's own, a typed task, a failure at the batch's commit, a handler that
puts the database's error into one of its own.

The values come from this module, never from the payload, so that a job's
page may be searched whole for them. The tables are `TABLES`.
"""

from __future__ import annotations

from typing import Any

import asyncpg
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from jobqueue import db, task
from jobqueue.registry import handlers

CARD = "4929730155660412"
API_KEY = "sk_live_7Hq2ZpW9xT4mN8rBv3"

TABLES = (
    "CREATE TABLE charges (card text PRIMARY KEY, api_key text NOT NULL)",
    "CREATE TABLE accounts (card text PRIMARY KEY)",
    # checked at COMMIT: the batch's, on the driver, not a handler's statement
    "CREATE TABLE refunds (card text NOT NULL REFERENCES accounts DEFERRABLE INITIALLY DEFERRED,"
    " api_key text NOT NULL)",
    "CREATE TABLE tokens (card text NOT NULL, token uuid NOT NULL)",
)
#: The charge every `charge*` handler repeats: a unique violation, whose
#: DETAIL quotes the card.
SEED = ("INSERT INTO charges VALUES ($1, $2)", CARD, API_KEY)

CHARGE = text("INSERT INTO charges (card, api_key) VALUES (:card, :key)")
REFUND = text("INSERT INTO refunds (card, api_key) VALUES (:card, :key)")
# A data exception: PostgreSQL quotes the input it could not read.
AS_NUMBER = text("SELECT CAST(CAST(:card AS text) AS integer), CAST(:key AS text)")
# asyncpg refuses the key as a uuid before sending it, quoting its repr.
TOKEN = text("INSERT INTO tokens (card, token) VALUES (:card, :key)")
VALUES = {"card": CARD, "key": API_KEY}


@handlers.register("charge_async")
async def charge_async(session: AsyncSession, payload: dict[str, Any]) -> None:
    await session.execute(CHARGE, VALUES)


@handlers.register("charge_sync")
def charge_sync(session: Session, payload: dict[str, Any]) -> None:
    session.execute(CHARGE, VALUES)


@handlers.register("charge_own_connection")
async def charge_own_connection(session: AsyncSession, payload: dict[str, Any]) -> None:
    conn = await asyncpg.connect(**db.asyncpg_connect_args(db.database_url()))
    try:
        await conn.execute(*SEED)
    finally:
        await conn.close()


@handlers.register("number_async")
async def number_async(session: AsyncSession, payload: dict[str, Any]) -> None:
    await session.execute(AS_NUMBER, VALUES)


@handlers.register("number_sync")
def number_sync(session: Session, payload: dict[str, Any]) -> None:
    session.execute(AS_NUMBER, VALUES)


@handlers.register("token_async")
async def token_async(session: AsyncSession, payload: dict[str, Any]) -> None:
    await session.execute(TOKEN, VALUES)


@handlers.register("refund_async")
async def refund_async(session: AsyncSession, payload: dict[str, Any]) -> None:
    await session.execute(REFUND, VALUES)


@handlers.register("refund_sync")
def refund_sync(session: Session, payload: dict[str, Any]) -> None:
    session.execute(REFUND, VALUES)


@handlers.register("charge_wrapped")
def charge_wrapped(session: Session, payload: dict[str, Any]) -> None:
    try:
        session.execute(CHARGE, VALUES)
    except DBAPIError as e:
        raise RuntimeError(f"the charge failed: {e}") from e


@task(max_retries=0)
async def charge_task(session: AsyncSession, attempt: int) -> None:
    await session.execute(CHARGE, VALUES)
