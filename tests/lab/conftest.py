"""The lab's tests: the lessons' helpers and the course's example handlers,
checked against the real PostgreSQL (a lesson that stopped being true fails
here too). Their databases also hold the examples' demo tables."""

from __future__ import annotations

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

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
