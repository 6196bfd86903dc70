"""The lab's tests: the lessons' helpers and the course's example handlers,
checked against the real PostgreSQL (a lesson that stopped being true fails
here too). Their databases also hold the examples' demo tables."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from jobqueue import db
from jobqueue.lab import examples


@pytest.fixture
async def db_url(db_url: str) -> str:
    """The test's own database (the core tests' fixture), with the demo
    tables `process_payment` writes to."""
    engine = create_async_engine(db_url)
    try:
        async with engine.begin() as conn:
            await examples.create_tables(conn)
    finally:
        await engine.dispose()
    return db_url


Labelled = Callable[..., Awaitable[dict[str, asyncpg.Connection]]]


@pytest.fixture
async def labelled(db_url: str) -> AsyncIterator[Labelled]:
    """Open connections named as `lab.connect` names them (`lab <label>`, so
    pg_locks helpers show the label); all are dropped after the test."""
    opened: list[asyncpg.Connection] = []

    async def open_(*labels: str) -> dict[str, asyncpg.Connection]:
        conns = {label: await db.connect(db_url, application_name=f"lab {label}")
                 for label in labels}
        opened.extend(conns.values())
        return conns

    yield open_
    for c in opened:
        c.terminate()
