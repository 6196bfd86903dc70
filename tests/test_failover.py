"""Failover, with real processes: a `jobqueue worker` whose DATABASE_URL names
a primary and its synchronous standby (`target_session_attrs=read-write`)
survives the primary's end and the standby's promotion. It reconnects to the
new primary by itself; every job enqueued before and after completes, each
one's effect (a row written through its session) exactly once, and the jobs
completed before the failure are neither lost nor run again.

Two ends for the primary: SIGKILL of its postmaster (its connections close),
and a freeze (SIGSTOP of all its processes: its connections stay open and
nothing answers, so only the worker's own timeouts notice). And the standby's
end, which holds the primary's commits. One pair serves them all: the lost
node is rebuilt as the new standby after each.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from jobqueue import db, embedded
from jobqueue.api import create_app
from jobqueue.embedded.pair import EmbeddedPair, migrated_pair
from jobqueue.testing import WorkerProcess, wait_for, worker_state
from tests.conftest import ROOT, TEST_TABLES

pytestmark = pytest.mark.skipif(not embedded.available(),
                                reason="no bundled PostgreSQL binaries (the `embedded` extra)")

#: Jobs enqueued before the failure (a second or so of work for the worker)
#: and after the promotion.
BEFORE, AFTER = 400, 50
#: Seconds each server of the URL gets to answer a connection: a frozen one
#: costs this much before the next is tried.
CONNECT_TIMEOUT = 2
LEASE = "2"


@pytest.fixture(scope="module")
async def pair() -> AsyncIterator[EmbeddedPair]:
    servers = await migrated_pair(*TEST_TABLES)
    yield servers
    await asyncio.to_thread(servers.stop)


async def _watch(url: str) -> asyncpg.Connection:
    """A connection of the test's own, to the read-write server, that never
    waits more than a few seconds for an answer."""
    return await db.connect(url, application_name="failover test", command_timeout=10)


async def _enqueue(conn: asyncpg.Connection, n: int) -> list[uuid.UUID]:
    rows = await conn.fetch(
        "INSERT INTO jobs (job_type, payload, run_at) SELECT 'write_effect',"
        " '{\"sleep\": 0.002}', clock_timestamp() FROM generate_series(1, $1) RETURNING id", n)
    return [r["id"] for r in rows]


_COMPLETED = "SELECT id, completed_at FROM jobs WHERE status = 'completed'"


@pytest.mark.parametrize("failure", ["freeze", "kill"])
async def test_a_worker_survives_the_primary_failing(pair: EmbeddedPair, failure: str,
                                                    tmp_path: Path) -> None:
    if pair.standby is None:  # the test before failed it over
        await asyncio.to_thread(pair.rebuild)
    url = pair.url() + f"&connect_timeout={CONNECT_TIMEOUT}"
    # Something to check: the standby is synchronous, and the worker's URL names both.
    assert pair.replication() == "sync"
    assert len(db.servers(url)) == 2
    watch = await _watch(url)
    await watch.execute("TRUNCATE jobs, effects; DELETE FROM jobqueue_workers")
    worker = WorkerProcess(url, tmp_path / "worker.log", "--import", "tests.handlers",
                           "--lease", LEASE, cwd=ROOT)
    app = create_app(url, token=None)
    api = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost")
    try:
        assert (await api.get("/queues")).status_code == 200  # its pool holds a connection
        await wait_for(lambda: _active(watch, worker), timeout=60,
                       message="the worker to be active")
        first_id = (await worker_state(watch, worker))["id"]
        before = await _enqueue(watch, BEFORE)
        await wait_for(lambda: watch.fetchval(
            "SELECT count(*) >= 100 FROM jobs WHERE status = 'completed'"), timeout=60,
            message="work under way")
        committed = dict(await watch.fetch(_COMPLETED))
        assert 0 < len(committed) < BEFORE  # work was left for after the failure
        watch.terminate()

        if failure == "kill":
            pair.kill_primary()
            # Until it is promoted, the standby is no server to write to.
            with pytest.raises(db.NoServerError, match="TargetServerAttributeNotMatched"):
                await db.connect(url)
        else:
            pair.freeze_primary()
        await pair.promote()

        # Straight to the new primary: through the URL, a frozen first server
        # would cost the test its connect_timeout again.
        watch = await _watch(db.pin(url, "127.0.0.1", pair.primary.port))
        assert await watch.fetchval("SELECT pg_is_in_recovery()") is False
        after = await _enqueue(watch, AFTER)
        await wait_for(lambda: watch.fetchval(
            "SELECT count(*) = $1 FROM jobs WHERE status = 'completed'", BEFORE + AFTER),
            timeout=60, interval=0.1, message="every job completed on the new primary")

        done = dict(await watch.fetch(_COMPLETED))
        assert set(done) == set(before) | set(after)
        effects = dict(await watch.fetch("SELECT job_id, count(*) FROM effects GROUP BY job_id"))
        assert set(effects) == set(done) and set(effects.values()) == {1}
        # Completed before the failure: still completed, at the same instant (never rerun).
        assert {job: done[job] for job in committed} == committed
        # The same process carried on, in a new life, on the new primary.
        assert worker.proc.poll() is None
        # Its registry row may still show the new life on its way to the lock.
        await wait_for(lambda: _active(watch, worker), timeout=30,
                       message="the worker active again")
        now = await worker_state(watch, worker)
        assert now is not None and now["id"] != first_id
        assert "starting over" in worker.log()
        if failure == "kill":
            # The API's pooled connection died with the old primary: a 503 (never
            # a 500) until its pool has a connection to the new one. (A frozen
            # server's connections never die: the API has no timeout of its own,
            # docs/limitations.md.)
            answers = [(await api.get("/queues")).status_code]
            while answers[-1] != 200 and len(answers) < 5:
                answers.append((await api.get("/queues")).status_code)
            assert answers[-1] == 200 and set(answers) <= {200, 503}, answers
        await watch.close()
    finally:
        await api.aclose()
        # A polite close of a connection to the frozen server would wait forever.
        await app.state.jobqueue_engine.dispose(close=failure == "kill")
        worker.close()
        if not watch.is_closed():
            watch.terminate()


async def _active(conn: asyncpg.Connection, worker: WorkerProcess) -> bool:
    row = await worker_state(conn, worker)
    return row is not None and row["state"] == "active"


async def test_a_worker_outlives_its_synchronous_standby(pair: EmbeddedPair,
                                                        tmp_path: Path) -> None:
    """A synchronous standby that is down holds every commit on the primary.
    The worker's upkeep does not wait for it (its commits are local), so the
    worker lives on in the same life instead of timing out over and over;
    the jobs' completions wait (committed means replicated) and go through
    once a standby streams again."""
    if pair.standby is None:
        await asyncio.to_thread(pair.rebuild)
    url = pair.url()
    watch = await _watch(url)
    await watch.execute("TRUNCATE jobs, effects; DELETE FROM jobqueue_workers")
    worker = WorkerProcess(url, tmp_path / "worker.log", "--import", "tests.handlers",
                           "--lease", LEASE, cwd=ROOT)
    try:
        await wait_for(lambda: _active(watch, worker), timeout=60,
                       message="the worker to be active")
        life = (await worker_state(watch, worker))["id"]
        pair.kill_standby()
        gone = await watch.fetchval("SELECT clock_timestamp()")
        await watch.execute("SET synchronous_commit = local")  # the test's own enqueue
        jobs = await _enqueue(watch, 3)
        # Heartbeats go on past a lease after the standby's end, in the same life...
        await wait_for(lambda: watch.fetchval(
            "SELECT heartbeat_at > $1::timestamptz + make_interval(secs => $2 * 1.5)"
            " FROM jobqueue_workers WHERE id = $3", gone, float(LEASE), life),
            timeout=30, message="heartbeats a lease and a half after the standby's end")
        assert (await worker_state(watch, worker))["id"] == life
        # ...while no job's completion could commit.
        assert await watch.fetchval("SELECT count(*) FROM jobs WHERE status = 'completed'") == 0
        await asyncio.to_thread(pair.rebuild)
        await wait_for(lambda: watch.fetchval(
            "SELECT count(*) = 3 FROM jobs WHERE status = 'completed'"), timeout=30,
            message="the jobs completed once a standby streams again")
        effects = dict(await watch.fetch("SELECT job_id, count(*) FROM effects GROUP BY job_id"))
        assert effects == dict.fromkeys(jobs, 1)
        assert "starting over" not in worker.log()
    finally:
        worker.close()
        watch.terminate()
