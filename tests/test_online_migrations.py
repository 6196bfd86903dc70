"""`jobqueue migrate` while the queue is in use: jobs enqueued and worked
the whole time, from every earlier revision to the newest.

The load is plain SQL that every revision accepts (an insert, a claim with
SKIP LOCKED and an update, `scale.Traffic`): what the workers and producers
of an earlier release do to the table, whichever release that was.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
from alembic.script import ScriptDirectory

from jobqueue import db
from jobqueue.benchmarks import scale
from jobqueue.schema import REVISION, migrations
from jobqueue.testing import WorkerProcess, wait_for
from tests.conftest import ROOT

HEAD = ScriptDirectory.from_config(migrations.alembic_config()).get_current_head()
EARLIER = [f"{n:04d}" for n in range(1, int(HEAD))]
#: Jobs in the table before the migration starts, half of them finished.
ROWS = 20_000


def test_the_code_runs_on_the_newest_revision() -> None:
    assert REVISION == HEAD


@pytest.fixture
async def old_url(server_url: str) -> AsyncIterator[str]:
    name = f"test_online_{uuid.uuid4().hex[:10]}"
    url = await db.create_database(server_url, name, replace=True)
    yield url
    await db.drop_database(server_url, name)


async def _at(url: str, revision: str) -> asyncpg.Connection:
    """The database at `revision`, with ROWS jobs (as SQL of that revision
    writes them), and a connection to look at it."""
    await migrations.upgrade(url, revision)
    conn = await db.connect(url)
    await conn.execute(
        "INSERT INTO jobs (job_type, payload, status, completed_at) "
        "SELECT 'noop', '{}', CASE WHEN g % 2 = 0 THEN 'completed' ELSE 'pending' END, "
        "       CASE WHEN g % 2 = 0 THEN now() END "
        "FROM generate_series(1, $1) AS g", ROWS)
    return conn


@pytest.mark.parametrize("start", EARLIER)
async def test_migrating_from_every_revision_while_jobs_come_and_go(
    old_url: str, start: str
) -> None:
    conn = await _at(old_url, start)
    try:
        load = scale.Traffic(old_url, rate=500, claim=scale.CLAIM_ANY_QUEUE)
        async with load.running():
            before = load.completed
            await migrations.upgrade(old_url)
            assert load.completed > before  # the worker kept working meanwhile
        assert load.errors == []
        assert await migrations.current(old_url) == HEAD
        assert await conn.fetchval("SELECT count(*) FROM jobs") == ROWS + load.enqueued
        invalid = await conn.fetch(
            "SELECT indexrelid::regclass::text AS name FROM pg_index "
            "WHERE indrelid = 'jobs'::regclass AND NOT indisvalid")
        assert invalid == []
        indexes = {r["indexname"] for r in await conn.fetch(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'jobs'")}
        assert {"idx_jobs_pickable", "uq_jobs_unique_key", "idx_jobs_failed"} <= indexes
        assert not any(name.endswith("_new") for name in indexes)
    finally:
        await conn.close()


async def test_a_revision_waits_out_a_long_transaction_instead_of_queueing_writers(
    old_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A transaction that keeps a job locked past the lock timeout: the
    revision that needs the table (0009 adds a column) gives up, rolls back
    and tries again, and succeeds once the transaction ends."""
    conn = await _at(old_url, "0008")
    holder = await db.connect(old_url)
    try:
        tx = holder.transaction()
        await tx.start()
        await holder.fetchval("SELECT id FROM jobs WHERE status = 'pending' LIMIT 1 FOR UPDATE")
        with caplog.at_level(logging.WARNING, logger="jobqueue.migrations"):
            migrating = asyncio.create_task(migrations.upgrade(old_url))
            await wait_for(lambda: any(getattr(r, "event", None) == "migration_retry"
                                       for r in caplog.records),
                           timeout=30, message="the revision to give up once")
            assert await migrations.current(old_url) == "0008"
            # Meanwhile a producer is not held up behind the waiting revision.
            await asyncio.wait_for(
                conn.execute("INSERT INTO jobs (job_type, payload) VALUES ('noop', '{}')"), 5)
            await tx.commit()
            await asyncio.wait_for(migrating, 60)
        assert await migrations.current(old_url) == HEAD
    finally:
        await holder.close()
        await conn.close()


async def test_a_new_worker_on_an_old_schema_waits_for_migrate_and_says_so(
    old_url: str, tmp_path: Path
) -> None:
    conn = await _at(old_url, EARLIER[-1])
    worker = WorkerProcess(old_url, tmp_path / "worker.log", "--import", "tests.handlers",
                           cwd=ROOT)
    try:
        await wait_for(lambda: "waiting for `jobqueue migrate`" in worker.log(), timeout=30,
                       message="the worker to say it waits for the schema")
        assert worker.proc.poll() is None
        assert await conn.fetchval("SELECT count(*) FROM jobs WHERE status = 'pending'") > 0
        await migrations.upgrade(old_url)
        await wait_for(lambda: _none_pending(conn), timeout=60,
                       message="the worker to run the jobs once the schema is there")
        assert "schema at " + HEAD in worker.log()
    finally:
        worker.close()
        await conn.close()


async def _none_pending(conn: asyncpg.Connection) -> bool:
    return await conn.fetchval("SELECT count(*) FROM jobs WHERE status = 'pending'") == 0
