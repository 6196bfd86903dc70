"""A FastAPI shop that enqueues in the request's transaction and runs its
jobs in its own process.

    export DATABASE_URL=$(jobqueue db up) && jobqueue migrate
    cd examples && uvicorn fastapi_app:app --port 8000
    curl -X POST 'localhost:8000/orders?cents=1999'   # the order and its job, in one transaction
    curl localhost:8000/queue/jobs                    # the queue's API; its dashboard: /queue/

Three patterns, each a few lines below:
- `transaction`: a dependency that gives each request a session inside a
  transaction, committed when the route returns and rolled back when it
  raises. A job enqueued there exists exactly when the order does.
- `create_router(engine)`: the queue's HTTP API and dashboard, mounted.
- `running_worker`: a worker in this process for the app's life, stopped
  gracefully (running jobs finish) when uvicorn shuts down. For more load,
  drop it and run `jobqueue worker --import fastapi_app` beside the app.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from jobqueue import task
from jobqueue.api import create_router
from jobqueue.contrib.fastapi import running_worker
from jobqueue.db import create_engine

engine = create_engine()  # DATABASE_URL
Session = async_sessionmaker(engine, expire_on_commit=False)


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "example_orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    cents: Mapped[int]
    paid: Mapped[bool] = mapped_column(default=False)


@task(max_retries=5)
async def charge(session: AsyncSession, order_id: int) -> int:
    order = await session.get(Order, order_id)
    if order is None:
        raise LookupError(f"no order {order_id}")
    order.paid = True  # commits with the job's completion, or not at all
    return order.cents


async def transaction() -> AsyncIterator[AsyncSession]:
    async with Session() as session, session.begin():
        yield session


Tx = Annotated[AsyncSession, Depends(transaction)]


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    async with running_worker(engine, concurrency=2) as worker:
        app.state.jobqueue_worker = worker
        yield
    await engine.dispose()


app = FastAPI(lifespan=lifespan)
app.include_router(create_router(engine), prefix="/queue")


@app.post("/orders", status_code=201)
async def place_order(cents: int, session: Tx) -> dict[str, object]:
    order = Order(cents=cents)
    session.add(order)
    await session.flush()  # the order's id
    job = await charge.enqueue(session, order_id=order.id)
    if cents <= 0:  # found late on purpose: the order and its job roll back together
        raise HTTPException(422, "an order costs something")
    return {"order_id": order.id, "job_id": str(job)}


@app.get("/worker")
async def worker_state() -> dict[str, object]:
    worker = app.state.jobqueue_worker
    return {"role": worker.role, "completed": worker.stats.completed}
