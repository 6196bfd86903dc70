"""The worker in this process: processing, retries, savepoints, scheduling."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from jobqueue import HandlerRegistry, JobRunner, RetryPolicy, db, enqueue, enqueue_many
from jobqueue.testing import drain, wait_for

FAST_RETRIES = RetryPolicy(base=0.05, factor=2.0, cap=1.0, jitter=0.0)


@pytest.fixture
def registry() -> HandlerRegistry:
    r = HandlerRegistry()

    @r.register("send_email")
    async def send_email(session: Any, payload: dict[str, Any]) -> dict[str, Any]:
        return {"sent_to": payload["to"]}

    return r


@contextlib.asynccontextmanager
async def running(runner: JobRunner) -> AsyncIterator[asyncio.Task[dict[str, Any]]]:
    """A runner in the background, stopped (and its report awaited) on exit."""
    task = asyncio.create_task(runner.run())
    try:
        yield task
    finally:
        runner.stop()
        await asyncio.wait_for(asyncio.shield(task), 30)


async def job(conn: asyncpg.Connection, job_id: object) -> asyncpg.Record:
    row = await conn.fetchrow("SELECT * FROM jobs WHERE id = $1", job_id)
    assert row is not None
    return row


async def status_of(conn: asyncpg.Connection, job_id: object) -> str:
    return (await job(conn, job_id))["status"]


def runner(db_url: str, registry: HandlerRegistry, **kw: Any) -> JobRunner:
    kw.setdefault("install_signal_handlers", False)
    kw.setdefault("poll_interval", 0.2)
    kw.setdefault("retry_policy", FAST_RETRIES)
    return JobRunner(db_url, registry=registry, **kw)


async def test_basic_processing(engine: AsyncEngine, db_url: str, registry, conn) -> None:
    async with engine.begin() as s:
        ids = [await enqueue(s, "send_email", {"to": f"user-{i}@test.com"}) for i in range(5)]

    report = await drain(db_url, registry=registry)

    assert report["processed"] == 5 and report["failed"] == 0 and report["retried"] == 0
    assert report["latency_ms"]["p50"] is not None and report["handler_ms"]["p99"] is not None
    rows = [await job(conn, i) for i in ids]
    assert {r["status"] for r in rows} == {"completed"}
    assert [r["result"] for r in rows] == [f'{{"sent_to": "user-{i}@test.com"}}' for i in range(5)]
    for r in rows:
        assert r["created_at"] <= r["started_at"] <= r["completed_at"]
        assert r["worker_id"] == report["worker_id"]
        assert r["retry_count"] == 0 and r["error_history"] == "[]"


async def test_retry_then_success(engine: AsyncEngine, db_url: str, conn) -> None:
    attempts: list[int] = []
    registry = HandlerRegistry()

    @registry.register("flaky")
    async def flaky(session: Any, payload: dict[str, Any]) -> dict[str, bool]:
        attempts.append(len(attempts) + 1)
        if len(attempts) < 3:
            raise ValueError(f"temporary failure {len(attempts)}")
        return {"ok": True}

    async with engine.begin() as s:
        job_id = await enqueue(s, "flaky", {}, max_retries=5)

    async with running(runner(db_url, registry)) as task:
        await wait_for(lambda: status_of(conn, job_id), message="a finished job",
                       timeout=15) and await wait_for(
            lambda: _is(conn, job_id, "completed"), message="completion", timeout=15)
    report = task.result()

    row = await job(conn, job_id)
    assert attempts == [1, 2, 3]
    assert row["status"] == "completed" and row["retry_count"] == 2
    history = __import__("json").loads(row["error_history"])
    assert [h["attempt"] for h in history] == [1, 2]
    assert [h["error"] for h in history] == ["ValueError: temporary failure 1",
                                              "ValueError: temporary failure 2"]
    for h in history:
        datetime.fromisoformat(h["at"])  # ISO 8601
    assert report["processed"] == 1 and report["retried"] == 2 and report["failed"] == 0
    assert report["error_rate"] == pytest.approx(2 / 3, abs=1e-3)


async def _is(conn: asyncpg.Connection, job_id: object, status: str) -> bool:
    return await status_of(conn, job_id) == status


async def test_max_retries_then_failed(engine: AsyncEngine, db_url: str, conn) -> None:
    registry = HandlerRegistry()
    calls = 0

    @registry.register("always_fail")
    async def always_fail(session: Any, payload: dict[str, Any]) -> None:
        nonlocal calls
        calls += 1
        raise ValueError("permanent error")

    async with engine.begin() as s:
        job_id = await enqueue(s, "always_fail", {}, max_retries=2)

    async with running(runner(db_url, registry)) as task:
        await wait_for(lambda: _is(conn, job_id, "failed"), message="failure", timeout=15)
    report = task.result()

    row = await job(conn, job_id)
    history = __import__("json").loads(row["error_history"])
    assert calls == 3  # the first attempt and max_retries=2 retries
    assert row["retry_count"] == 2
    assert len(history) == 3 and [h["attempt"] for h in history] == [1, 2, 3]
    assert row["error_message"] == "ValueError: permanent error"
    assert row["completed_at"] is not None and row["next_retry_at"] is None
    assert report["failed"] == 1 and report["retried"] == 2 and report["processed"] == 0


async def test_backoff_is_exponential_and_on_the_database_clock(
    engine: AsyncEngine, db_url: str, conn
) -> None:
    registry = HandlerRegistry()

    @registry.register("fail")
    async def fail(session: Any, payload: dict[str, Any]) -> None:
        raise RuntimeError("no")

    policy = RetryPolicy(base=0.2, factor=2.0, cap=10.0, jitter=0.0)
    async with engine.begin() as s:
        job_id = await enqueue(s, "fail", {}, max_retries=3)
    async with running(runner(db_url, registry, retry_policy=policy)):
        await wait_for(lambda: _is(conn, job_id, "failed"), message="failure", timeout=20)

    history = __import__("json").loads((await job(conn, job_id))["error_history"])
    times = [datetime.fromisoformat(h["at"]) for h in history]
    gaps = [(b - a).total_seconds() for a, b in zip(times, times[1:], strict=False)]
    # Each retry waits at least its backoff (0.2, 0.4, 0.8 s), measured by PostgreSQL.
    for gap, wanted in zip(gaps, [0.2, 0.4, 0.8], strict=True):
        assert gap >= wanted


async def test_error_message_is_bounded(engine: AsyncEngine, db_url: str, conn) -> None:
    registry = HandlerRegistry()

    @registry.register("loud")
    async def loud(session: Any, payload: dict[str, Any]) -> None:
        raise RuntimeError("x" * 10_000)

    async with engine.begin() as s:
        job_id = await enqueue(s, "loud", {}, max_retries=0)
    await drain(db_url, registry=registry)
    row = await job(conn, job_id)
    assert row["status"] == "failed"
    assert len(row["error_message"]) == 2000
    assert len(__import__("json").loads(row["error_history"])[0]["error"]) == 2000


async def test_a_job_of_a_type_without_handler_is_left_waiting(
    engine: AsyncEngine, db_url: str, registry, conn
) -> None:
    async with engine.begin() as s:
        unknown = await enqueue(s, "no_such_type", {}, max_retries=5)
        known = await enqueue(s, "send_email", {"to": "a@b.c"})
    report = await drain(db_url, registry=registry)
    assert await status_of(conn, known) == "completed"  # the worker did work...
    row = await job(conn, unknown)  # ...and never touched the job it cannot run
    assert row["status"] == "pending" and row["retry_count"] == 0
    assert row["error_message"] is None and row["started_at"] is None
    assert report["processed"] == 1 and report["failed"] == 0


async def test_a_handler_gone_between_claim_and_run_is_a_failed_attempt_retried(
    engine: AsyncEngine, db_url: str, conn
) -> None:
    registry = HandlerRegistry()

    @registry.register("first")
    async def first(session: Any, payload: dict[str, Any]) -> None:
        registry.remove("second")  # after the batch was taken, before its turn

    @registry.register("second")
    async def second(session: Any, payload: dict[str, Any]) -> None:
        raise AssertionError("removed: never runs")

    async with engine.begin() as s:
        await enqueue(s, "first", {}, priority=1)  # runs first in the batch
        gone = await enqueue(s, "second", {}, max_retries=2)
    await drain(db_url, registry=registry, concurrency=1, quick_batch=0)
    row = await job(conn, gone)
    assert row["status"] == "retrying" and row["retry_count"] == 1  # not failed for good
    assert "no handler registered for job type 'second'" in row["error_message"]
    assert row["next_retry_at"] is not None


async def test_handler_that_swallows_a_database_error_fails_alone(
    engine: AsyncEngine, db_url: str, conn
) -> None:
    registry = HandlerRegistry()

    @registry.register("sloppy")
    async def sloppy(session: Any, payload: dict[str, Any]) -> None:
        await session.execute(text("INSERT INTO effects (job_id) VALUES (gen_random_uuid())"))
        with contextlib.suppress(Exception):
            await session.execute(text("SELECT 1/0"))

    @registry.register("tidy")
    async def tidy(session: Any, payload: dict[str, Any]) -> None:
        await session.execute(text("INSERT INTO effects (job_id, n) VALUES (gen_random_uuid(), 2)"))

    async with engine.begin() as s:
        first = await enqueue(s, "tidy", {})
        bad = await enqueue(s, "sloppy", {}, max_retries=0)
        last = await enqueue(s, "tidy", {})
    report = await drain(db_url, registry=registry, batch_size=10)
    assert await status_of(conn, bad) == "failed"
    assert await status_of(conn, first) == "completed"
    assert await status_of(conn, last) == "completed"
    assert await conn.fetchval("SELECT array_agg(n ORDER BY n) FROM effects") == [2, 2]
    assert report["processed"] == 2 and report["failed"] == 1


async def test_result_that_is_not_json_fails_the_job(engine: AsyncEngine, db_url, conn) -> None:
    registry = HandlerRegistry()

    @registry.register("odd")
    async def odd(session: Any, payload: dict[str, Any]) -> object:
        await session.execute(text("INSERT INTO effects (job_id) VALUES (gen_random_uuid())"))
        return {"lock": threading.Lock()}  # no JSON form, and none registered

    async with engine.begin() as s:
        job_id = await enqueue(s, "odd", {}, max_retries=0)
    await drain(db_url, registry=registry)
    row = await job(conn, job_id)
    assert row["status"] == "failed" and "not JSON" in row["error_message"]
    assert await conn.fetchval("SELECT count(*) FROM effects") == 0


async def test_scheduled_job_waits_for_its_time(engine: AsyncEngine, db_url, registry, conn):
    db_now = await conn.fetchval("SELECT now()")
    run_at = db_now + timedelta(seconds=1.5)
    async with engine.begin() as s:
        later = await enqueue(s, "send_email", {"to": "later@x"}, run_at=run_at)
        now_job = await enqueue(s, "send_email", {"to": "now@x"})

    early = await drain(db_url, registry=registry)
    assert early["processed"] == 1
    assert await status_of(conn, now_job) == "completed"
    assert await status_of(conn, later) == "pending"

    async with running(runner(db_url, registry, poll_interval=5.0)):
        await wait_for(lambda: _is(conn, later, "completed"), message="the scheduled job",
                       timeout=10)
    row = await job(conn, later)
    assert row["started_at"] >= run_at


async def test_plain_sql_insert_is_a_job_and_wakes_an_idle_worker(db_url, registry, conn):
    """A long poll interval: only LISTEN/NOTIFY can start the job in time."""
    r = runner(db_url, registry, poll_interval=60.0)
    async with running(r):
        await asyncio.wait_for(r.wait_active(), 10)
        await wait_for(lambda: r.bell.waiting > 0, message="an idle runner")
        job_id = await conn.fetchval(
            "INSERT INTO jobs (job_type, payload) VALUES ('send_email', '{\"to\": \"sql@x\"}') "
            "RETURNING id")
        await wait_for(lambda: _is(conn, job_id, "completed"), timeout=10,
                       message="completion of a job inserted by plain SQL")


async def test_jobs_of_a_dead_worker_are_rescued(engine: AsyncEngine, db_url, registry, conn):
    # Two jobs claimed by worker 12345, which holds no liveness lock: it is
    # gone, and nothing says which of them took it down. Neither is blamed.
    ids = [await conn.fetchval(
        "INSERT INTO jobs (job_type, payload, status, worker_id, started_at) "
        "VALUES ('send_email', '{\"to\": \"x@y\"}', 'processing', 12345, now()) RETURNING id")
        for _ in range(2)]
    report = await drain(db_url, registry=registry)
    assert report["rescued"] == 2
    for job_id in ids:
        row = await job(conn, job_id)
        assert row["status"] == "completed" and row["worker_id"] == report["worker_id"]
        assert row["retry_count"] == 0 and row["run_alone"]  # uncounted; it ran alone


async def test_a_job_its_worker_died_running_alone_has_the_attempt_counted(
        engine: AsyncEngine, db_url, registry, conn):
    job_id = await conn.fetchval(
        "INSERT INTO jobs (job_type, payload, status, worker_id, started_at, max_retries) "
        "VALUES ('send_email', '{}', 'processing', 12345, now(), 1) RETURNING id")
    policy = RetryPolicy(base=30.0, factor=2.0, cap=60.0, jitter=0.0)
    report = await drain(db_url, registry=registry, retry_policy=policy)
    assert report["rescued"] == 1 and report["processed"] == 0  # due again only in 30 s
    row = await job(conn, job_id)
    assert row["status"] == "retrying" and row["retry_count"] == 1 and row["run_alone"]
    assert row["error_message"] == "its worker (id 12345) died while running it"
    assert 29 < (row["run_at"] - row["started_at"]).total_seconds() < 90
    # The last attempt lost the same way fails the job for good.
    await conn.execute("UPDATE jobs SET status = 'processing', worker_id = 12346 WHERE id = $1",
                       job_id)
    assert (await drain(db_url, registry=registry))["rescued"] == 1
    row = await job(conn, job_id)
    assert row["status"] == "failed" and row["retry_count"] == 1
    assert [e["worker_id"] for e in json.loads(row["error_history"])] == [12345, 12346]


async def test_only_one_runner_works_the_other_stands_by(
    engine: AsyncEngine, db_url: str, registry, conn, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="jobqueue.worker")
    async with engine.begin() as s:
        await enqueue_many(s, "send_email", [{"to": f"u{i}@t.com"} for i in range(20)])
    first, second = runner(db_url, registry), runner(db_url, registry)
    t1 = asyncio.create_task(first.run())
    await asyncio.wait_for(first.wait_active(), 10)
    t2 = asyncio.create_task(second.run())
    await wait_for(lambda: second.state == "standby", message="the second runner standing by")
    await wait_for(lambda: _count(conn, "completed", 20), message="20 completed jobs")
    async with engine.begin() as s:
        await enqueue_many(s, "send_email", [{"to": f"v{i}@t.com"} for i in range(20)])
    await wait_for(lambda: _count(conn, "completed", 40), message="40 completed jobs")
    assert second.state == "standby"

    second.stop()
    first.stop()
    r1, r2 = await asyncio.wait_for(asyncio.gather(t1, t2), 30)
    assert r1["was_active"] and r1["processed"] == 40
    assert not r2["was_active"] and r2["processed"] == 0
    workers = await conn.fetch("SELECT DISTINCT worker_id FROM jobs")
    assert [w["worker_id"] for w in workers] == [first.worker_id]
    # Each said its role and what it runs.
    roles = {r.worker_id: r.getMessage() for r in caplog.records  # type: ignore[attr-defined]
             if getattr(r, "event", None) in ("worker_active", "worker_standby")}
    serves = "it runs 1 job type (send_email) from every queue"
    assert roles == {first.worker_id: f"worker {first.worker_id} is active; {serves}",
                     second.worker_id: f"worker {second.worker_id} standing by (another "
                                       f"worker is active); {serves}"}


async def test_a_runner_without_handlers_does_not_start(db_url: str, conn) -> None:
    """It would take the active role and run nothing, while a worker with
    the handlers stood by behind it."""
    with pytest.raises(db.ConfigError, match="no handlers are registered"):
        await runner(db_url, HandlerRegistry()).run()
    assert await conn.fetchval("SELECT count(*) FROM jobqueue_workers") == 0


async def _count(conn: asyncpg.Connection, status: str, n: int) -> bool:
    return await conn.fetchval("SELECT count(*) FROM jobs WHERE status = $1", status) == n


async def test_standby_takes_over_when_the_active_runner_stops(
    engine: AsyncEngine, db_url, registry, conn
) -> None:
    first, second = runner(db_url, registry), runner(db_url, registry)
    t1 = asyncio.create_task(first.run())
    await asyncio.wait_for(first.wait_active(), 10)
    t2 = asyncio.create_task(second.run())
    await wait_for(lambda: second.state == "standby", message="standby")
    first.stop()
    await asyncio.wait_for(t1, 30)
    await asyncio.wait_for(second.wait_active(), 10)
    async with engine.begin() as s:
        job_id = await enqueue(s, "send_email", {"to": "after@x"})
    await wait_for(lambda: _is(conn, job_id, "completed"), message="completion by the standby")
    assert (await job(conn, job_id))["worker_id"] == second.worker_id
    second.stop()
    await asyncio.wait_for(t2, 30)


async def test_many_lanes_share_the_work(engine: AsyncEngine, db_url: str, conn) -> None:
    registry = HandlerRegistry()
    running_now = 0
    peak = 0

    @registry.register("io")
    async def io(session: Any, payload: dict[str, Any]) -> None:
        nonlocal running_now, peak
        running_now += 1
        peak = max(peak, running_now)
        await asyncio.sleep(0.05)
        running_now -= 1

    async with engine.begin() as s:
        await enqueue_many(s, "io", [{} for _ in range(40)])
    report = await drain(db_url, registry=registry, concurrency=4, batch_size=5)
    assert report["processed"] == 40
    assert peak == 4  # four lanes ran handlers at the same time
    assert await _count(conn, "completed", 40)




async def test_a_handler_network_error_is_the_jobs_failure(engine: AsyncEngine, db_url, conn):
    """ConnectionError or TimeoutError from another service (SMTP, HTTP) counts
    as a failed attempt; only the lane's own database connection failing sends
    the batch back uncounted."""
    registry = HandlerRegistry()

    @registry.register("smtp")
    async def smtp(session: Any, payload: dict[str, Any]) -> None:
        raise ConnectionError("SMTP server refused the connection")

    @registry.register("slow_api")
    async def slow_api(session: Any, payload: dict[str, Any]) -> None:
        raise TimeoutError("the API did not answer")

    async with engine.begin() as s:
        smtp_job = await enqueue(s, "smtp", {}, max_retries=0)
        api_job = await enqueue(s, "slow_api", {}, max_retries=0)
    report = await asyncio.wait_for(drain(db_url, registry=registry), 30)
    assert report["failed"] == 2 and report["handed_back"] == 0
    assert "SMTP server refused" in (await job(conn, smtp_job))["error_message"]
    assert (await job(conn, api_job))["status"] == "failed"


async def test_what_postgresql_cannot_store_fails_the_job_not_the_worker(
    engine: AsyncEngine, db_url: str, conn
) -> None:
    registry = HandlerRegistry()

    @registry.register("nul_result")
    async def nul_result(session: Any, payload: dict[str, Any]) -> dict[str, str]:
        return {"text": "a\x00b"}

    @registry.register("nul_error")
    async def nul_error(session: Any, payload: dict[str, Any]) -> None:
        raise ValueError("bad byte \x00 and \ud800 here")

    @registry.register("fine")
    async def fine(session: Any, payload: dict[str, Any]) -> None:
        return None

    async with engine.begin() as s:
        first = await enqueue(s, "nul_result", {}, max_retries=0)
        second = await enqueue(s, "nul_error", {}, max_retries=0)
        third = await enqueue(s, "fine", {})
    report = await drain(db_url, registry=registry, batch_size=10)
    assert report["processed"] == 1 and report["failed"] == 2
    assert "NUL" in (await job(conn, first))["error_message"]
    assert (await job(conn, second))["error_message"].startswith("ValueError: bad byte \\0")
    assert await status_of(conn, third) == "completed"


async def test_a_deferred_constraint_fails_its_own_job_alone(
    engine: AsyncEngine, db_url: str, conn, child_registry: HandlerRegistry
) -> None:
    """Checked only at the batch's COMMIT: the batch is rerun job by job."""
    registry = child_registry
    async with engine.begin() as s:
        good = await enqueue(s, "child", {"p": 1})
        orphan = await enqueue(s, "child", {"p": 2}, max_retries=0)
        other = await enqueue(s, "child", {"p": 1})
    report = await drain(db_url, registry=registry, batch_size=10)
    assert await status_of(conn, good) == "completed"
    assert await status_of(conn, other) == "completed"
    row = await job(conn, orphan)
    assert row["status"] == "failed" and "ForeignKeyViolation" in row["error_message"]
    assert await conn.fetchval("SELECT count(*) FROM children") == 2
    assert report["processed"] == 2 and report["failed"] == 1


async def test_a_handler_that_commits_fails_and_writes_nothing(
    engine: AsyncEngine, db_url: str, conn
) -> None:
    registry = HandlerRegistry()

    @registry.register("committer")
    async def committer(session: Any, payload: dict[str, Any]) -> None:
        await session.execute(text("INSERT INTO effects (job_id) VALUES (gen_random_uuid())"))
        await session.commit()

    async with engine.begin() as s:
        job_id = await enqueue(s, "committer", {}, max_retries=0)
    await drain(db_url, registry=registry)
    row = await job(conn, job_id)
    assert row["status"] == "failed" and "must not commit" in row["error_message"]
    assert await conn.fetchval("SELECT count(*) FROM effects") == 0


async def test_a_runner_without_a_database_says_so_and_starts_no_server(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """A library must not start a database server behind its user's back: with
    no URL and no DATABASE_URL, run() raises; only the CLI starts one."""
    from jobqueue import embedded

    def refuse(*args: object) -> str:
        raise AssertionError("JobRunner started the embedded server")

    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setattr(embedded, "ensure_running", refuse)
    monkeypatch.setattr(embedded.EmbeddedPostgres, "start", refuse)
    with pytest.raises(db.ConfigError, match="DATABASE_URL"):
        await JobRunner(install_signal_handlers=False).run()


async def test_a_burst_run_ends_when_its_lanes_are_done_not_a_poll_interval_later(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection) -> None:
    """Two lanes share the jobs in quick batches; the lane that runs out first
    sees the other's batch still due (locked, not yet committed) and waits
    for news. The end of that batch is news: were it not, the run would
    sleep out its poll interval (here two minutes) before it could end."""
    registry = HandlerRegistry()
    lanes: set[int] = set()

    @registry.register("work")
    async def work(session: Any, payload: dict[str, Any]) -> None:
        lanes.add(id(asyncio.current_task()))
        await asyncio.sleep(0.002)

    async with engine.begin() as s:
        await enqueue_many(s, "work", [{}] * 300)
    report = await asyncio.wait_for(
        drain(db_url, registry=registry, concurrency=2, poll_interval=120), 60)
    assert report["processed"] == 300 and report["batches"] > 2
    assert len(lanes) == 2  # both lanes worked: one of them had to wait for the other
    assert await conn.fetchval("SELECT count(*) FROM jobs WHERE status = 'completed'") == 300


async def test_drain_says_at_once_that_an_active_worker_would_run_the_jobs(
        engine: AsyncEngine, db_url: str, conn: asyncpg.Connection) -> None:
    """A development worker left running holds the active lock: an exclusive
    drain would stand by for ever. It says so; `shared=True` runs beside it."""
    other = HandlerRegistry()  # the running worker knows no type the drain runs

    @other.register("elsewhere")
    async def elsewhere(session: Any, payload: dict[str, Any]) -> None:
        return None

    ours = HandlerRegistry()

    @ours.register("mine")
    async def mine(session: Any, payload: dict[str, Any]) -> None:
        return None

    active = runner(db_url, other)
    async with running(active):
        await wait_for(lambda: active.state == "active", message="the other worker active")
        async with engine.begin() as s:
            job_id = await enqueue(s, "mine", {})
        with pytest.raises(RuntimeError, match=r"'jobqueue worker \d+ active [^']*' is the "
                                               r"active worker on this database"):
            await asyncio.wait_for(drain(db_url, registry=ours), 10)
        report = await asyncio.wait_for(drain(db_url, registry=ours, shared=True), 30)
    assert report["processed"] == 1 and await status_of(conn, job_id) == "completed"


async def test_a_worker_that_cannot_connect_names_the_server_never_the_password(
        caplog: pytest.LogCaptureFixture) -> None:
    from jobqueue.embedded.pair import free_ports

    registry = HandlerRegistry()

    @registry.register("noop")
    async def noop(session: Any, payload: dict[str, Any]) -> None:
        return None

    port = free_ports(1)[0]  # nothing listens there
    lost = runner(f"postgresql+asyncpg://alice:S3CRETPW@127.0.0.1:{port}/jobs", registry)

    def restarts() -> list[logging.LogRecord]:
        return [r for r in caplog.records if getattr(r, "event", None) == "worker_restarting"]

    with caplog.at_level(logging.WARNING, logger="jobqueue.worker"):
        async with running(lost):
            said = (await wait_for(restarts, message="a failed start logged"))[0]
    assert f"PostgreSQL at 127.0.0.1:{port}" in said.getMessage()
    assert said.server == f"127.0.0.1:{port}"  # type: ignore[attr-defined]
    assert "S3CRETPW" not in said.getMessage() and "alice" not in said.getMessage()
