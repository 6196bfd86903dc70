"""Typed tasks, end to end: enqueue with checked arguments, run them, read the
typed results back.

    export DATABASE_URL=$(jobqueue db up) && jobqueue migrate
    python examples/typed_tasks.py

It runs the jobs itself (a burst worker: every due job, then it returns);
in production `jobqueue worker --import typed_tasks` would.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import enum
from dataclasses import dataclass
from decimal import Decimal

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

import jobqueue
from jobqueue import JobRunner, task
from jobqueue.db import create_engine


class Tier(enum.Enum):
    STANDARD = "standard"
    EXPRESS = "express"


@dataclass
class Line:
    sku: str
    price: Decimal
    quantity: int = 1


@dataclass
class Invoice:
    order_id: int
    total: Decimal
    due: dt.date


@task(queue="billing", max_retries=5, timeout=30)
async def invoice(session: AsyncSession, order_id: int, lines: list[Line],
                  tier: Tier = Tier.STANDARD) -> Invoice:
    total = sum((line.price * line.quantity for line in lines), Decimal(0))
    if tier is Tier.EXPRESS:
        total += Decimal("4.90")
    # The worker's session: this row commits together with the job's completion.
    await session.execute(text("INSERT INTO invoices (order_id, total) VALUES (:id, :total)"),
                          {"id": order_id, "total": total})
    return Invoice(order_id, total, dt.date.today() + dt.timedelta(days=30))


async def main() -> None:
    engine = create_engine()  # DATABASE_URL
    Session = async_sessionmaker(engine, expire_on_commit=False)
    async with engine.begin() as conn:
        await conn.execute(text("CREATE TABLE IF NOT EXISTS invoices "
                                "(order_id int PRIMARY KEY, total numeric NOT NULL)"))
        await conn.execute(text("DELETE FROM invoices WHERE order_id IN (1, 2)"))

    async with Session() as session, session.begin():
        first = await invoice.enqueue(session, 1, [Line("BOOK-1", Decimal("12.50"), 2)])
        second = await invoice.enqueue(session, order_id=2, tier=Tier.EXPRESS,
                                       lines=[Line("PEN-7", Decimal("1.99"))])
        try:  # checked before anything is written: the transaction goes on
            await invoice.enqueue(session, order_id="3", lines=[])  # type: ignore[arg-type]
        except TypeError as e:
            print(f"refused: {e}")

    await JobRunner(engine.url.render_as_string(hide_password=False), burst=True,
                    queues=["billing"], install_signal_handlers=False).run()

    for job in (first, second):
        finished = await jobqueue.wait(job, timeout=30, database=engine)
        bill = finished.result  # an Invoice, read back by the return annotation
        print(f"order {bill.order_id}: {finished.status}, {bill.total} due {bill.due:%Y-%m-%d}")
    await engine.dispose()


if __name__ == "__main__":
    asyncio.run(main())
