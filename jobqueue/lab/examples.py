"""The course's three example handlers, loadable with
`jobqueue worker --import jobqueue.lab.examples`.

`process_payment` shows why a handler's writes are undone alone when it
fails: it moves money and records the payment; if either step fails, neither
happened (its savepoint is rolled back to, or, for a job that ran without one,
its batch is rolled back and run again with one per job).
"""

from __future__ import annotations

import logging
from decimal import Decimal, InvalidOperation
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from jobqueue.registry import handlers

logger = logging.getLogger(__name__)

#: The demo tables process_payment writes to. Not part of the queue's schema:
#: `create_tables` makes them where a test or a notebook wants them.
DEMO_TABLES = (
    """CREATE TABLE IF NOT EXISTS demo_users (
           id integer PRIMARY KEY,
           balance numeric(12, 2) NOT NULL DEFAULT 0 CHECK (balance >= 0))""",
    """CREATE TABLE IF NOT EXISTS demo_payments (
           payment_id text PRIMARY KEY,
           user_id integer NOT NULL REFERENCES demo_users (id),
           amount numeric(12, 2) NOT NULL,
           paid_at timestamptz NOT NULL DEFAULT now())""",
)


async def create_tables(conn: AsyncConnection | AsyncSession) -> None:
    for statement in DEMO_TABLES:
        await conn.execute(text(statement))


@handlers.register("send_email")
async def send_email(session: AsyncSession, payload: dict[str, Any]) -> dict[str, Any]:
    to = payload["to"]
    subject = payload.get("subject", "Notification")
    logger.info("email to %s: %s", to, subject)  # a real app calls its mail service here
    return {"sent_to": to}


@handlers.register("generate_report")
async def generate_report(session: AsyncSession, payload: dict[str, Any]) -> dict[str, Any]:
    report_id = payload["report_id"]
    logger.info("generating report %s", report_id)
    return {"report_id": report_id, "url": f"/reports/{report_id}.pdf"}


@handlers.register("process_payment")
async def process_payment(session: AsyncSession, payload: dict[str, Any]) -> dict[str, Any]:
    """Credit (or debit, with a negative amount) a user's balance, once.

    Two writes: the balance, then the payment's record, whose primary key
    makes a payment id count once. A second run of the same payment fails on
    that key after the balance update, and the update is taken back with it:
    the balance moves exactly once. An overdraft fails the balance's
    CHECK and changes nothing either.
    """
    user_id = int(payload["user_id"])
    try:
        amount = Decimal(str(payload["amount"]))
    except InvalidOperation:
        raise ValueError(f"amount is not a number: {payload['amount']!r}") from None
    payment_id = str(payload.get("payment_id") or f"{user_id}:{amount}")
    balance = await session.scalar(
        text("UPDATE demo_users SET balance = balance + :amount WHERE id = :user_id "
             "RETURNING balance"),
        {"amount": amount, "user_id": user_id},
    )
    if balance is None:
        raise LookupError(f"no user {user_id}")
    await session.execute(
        text("INSERT INTO demo_payments (payment_id, user_id, amount) "
             "VALUES (:payment_id, :user_id, :amount)"),
        {"payment_id": payment_id, "user_id": user_id, "amount": amount},
    )
    return {"user_id": user_id, "amount": str(amount), "balance": str(balance)}
