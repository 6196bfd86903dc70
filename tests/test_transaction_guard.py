"""No statement of a handler can end its job's transaction (`worker/guard.py`).

A handler that sends COMMIT itself would make its writes durable before its
job's outcome: a failure after it, and each retry, would write them again.
Such statements are refused before they reach the server, in async and sync
handlers alike, and the job fails saying why, even if the handler catches
the error and returns.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from jobqueue import HandlerRegistry, enqueue
from jobqueue.retry import RetryPolicy
from jobqueue.testing import drain
from jobqueue.worker.guard import refusal

#: Each statement, and the word the job's error names.
ENDING = [
    ("COMMIT", "COMMIT"),
    ("end", "END"),
    ("ROLLBACK", "ROLLBACK"),
    ("ABORT", "ABORT"),
    ("BEGIN", "BEGIN"),
    ("PREPARE TRANSACTION 'jq'", "PREPARE TRANSACTION"),
    ("/* a comment */ COMMIT AND CHAIN", "COMMIT"),
    ("SELECT 1; COMMIT", "COMMIT"),
    ("RELEASE SAVEPOINT jobqueue_job", "savepoint jobqueue_job"),
    ("ROLLBACK TO jobqueue_job", "savepoint jobqueue_job"),
]
INCREMENT = "UPDATE counters SET n = n + 1"


@pytest.fixture
async def counters(conn: asyncpg.Connection) -> asyncpg.Connection:
    await conn.execute("CREATE TABLE counters (n int NOT NULL); INSERT INTO counters VALUES (1)")
    return conn


def _registry(statement: str, swallow: bool) -> HandlerRegistry:
    """One async and one sync handler that write, send `statement`, then
    fail (or, with `swallow`, catch its error and return)."""
    registry = HandlerRegistry()

    @registry.register("async_ender")
    async def async_ender(session: AsyncSession, payload: dict[str, Any]) -> None:
        await session.execute(text(INCREMENT))
        try:
            await session.execute(text(statement))
        except Exception:
            if not swallow:
                raise
            return
        raise RuntimeError("the statement went through")

    @registry.register("sync_ender")
    def sync_ender(session: Any, payload: dict[str, Any]) -> None:
        session.execute(text(INCREMENT))
        try:
            session.execute(text(statement))
        except Exception:
            if not swallow:
                raise
            return
        raise RuntimeError("the statement went through")

    @registry.register("async_ok")
    async def async_ok(session: AsyncSession, payload: dict[str, Any]) -> None:
        await session.execute(text(INCREMENT))

    return registry


async def _enqueue(engine: AsyncEngine, types: list[str], max_retries: int) -> list[uuid.UUID]:
    start = datetime.now(UTC) - timedelta(minutes=1)
    async with engine.begin() as s:
        return [await enqueue(s, job_type, {}, max_retries=max_retries,
                              run_at=start + timedelta(microseconds=i))
                for i, job_type in enumerate(types)]


@pytest.mark.parametrize(("statement", "named"), ENDING, ids=[s for s, _ in ENDING])
@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_a_handler_that_ends_its_transaction_is_refused_and_writes_nothing(
        engine: AsyncEngine, db_url: str, counters: asyncpg.Connection, kind: str,
        statement: str, named: str) -> None:
    """The issue's case: write, send the statement, raise; retried twice.
    Before the guard, `n` went from 1 to 4 with COMMIT (each attempt's write
    committed) and the retries failed on ROLLBACK TO SAVEPOINT."""
    registry = _registry(statement, swallow=False)
    [job_id] = await _enqueue(engine, [f"{kind}_ender"], max_retries=2)
    report = await drain(db_url, registry=registry,
                         retry_policy=RetryPolicy(base=0.0, jitter=0.0))
    assert report["failed"] == 1 and report["retried"] == 2, report
    row = await counters.fetchrow(
        "SELECT status, retry_count, error_history::text AS history FROM jobs WHERE id = $1",
        job_id)
    assert (row["status"], row["retry_count"]) == ("failed", 2)
    errors = [entry["error"] for entry in json.loads(row["history"])]
    assert len(errors) == 3, errors
    assert all(e.startswith("HandlerCommitError: handlers must") and named in e for e in errors)
    assert await counters.fetchval("SELECT n FROM counters") == 1


@pytest.mark.parametrize("savepoints", ["auto", "always"])
@pytest.mark.parametrize("statement", ["COMMIT", "SELECT 1; COMMIT"])
async def test_a_refused_statement_fails_the_job_even_if_the_handler_catches_it(
        engine: AsyncEngine, db_url: str, counters: asyncpg.Connection, savepoints: str,
        statement: str) -> None:
    """In a quick batch between two writers (async), and in a thread (sync):
    the catcher fails, its write is gone, the others' commit once."""
    registry = _registry(statement, swallow=True)
    types = ["async_ok", "async_ok", "async_ender", "async_ok", "sync_ender", "async_ok"]
    ids = await _enqueue(engine, types, max_retries=0)
    report = await drain(db_url, registry=registry, savepoints=savepoints,
                         quick_batch=5.0, concurrency=1)
    assert report["processed"] == 4 and report["failed"] == 2, report
    rows = dict(await counters.fetch("SELECT id, error_message FROM jobs WHERE status = 'failed'"))
    assert set(rows) == {ids[2], ids[4]}
    assert all(error.startswith("HandlerCommitError: handlers must not run COMMIT")
               for error in rows.values()), rows
    assert await counters.fetchval("SELECT n FROM counters") == 1 + 4


@pytest.mark.parametrize("statement", [
    "SELECT 'COMMIT'", "SELECT 1 -- ; COMMIT", "SELECT $$; COMMIT$$", "SELECT e'\\'; COMMIT'",
    "SELECT 1 /* /* ; */ COMMIT */", "UPDATE t SET end_at = 1", "ROLLBACK TO SAVEPOINT mine",
    "SAVEPOINT sa_savepoint_1", "RELEASE sa_savepoint_1", "PREPARE p AS SELECT 1",
    'SELECT "commit" FROM t',
])
def test_what_only_looks_like_an_ending_is_let_through(statement: str) -> None:
    assert refusal(statement) is None
