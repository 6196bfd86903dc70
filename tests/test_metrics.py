"""Metrics (`GET /metrics`) and the `jobqueue status` summary, read from the
database after real work."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from jobqueue import HandlerRegistry, JobRunner, RetryPolicy, enqueue_many, queues
from jobqueue.ops import metrics
from jobqueue.ops import status as report
from jobqueue.ops.cli import format_summary
from jobqueue.testing import drain, wait_for


def registry() -> HandlerRegistry:
    r = HandlerRegistry()

    @r.register("ok")
    async def ok(session: AsyncSession, payload: dict[str, Any]) -> None:
        return None

    @r.register("bad")
    async def bad(session: AsyncSession, payload: dict[str, Any]) -> None:
        raise ValueError(f"bad input {payload.get('kind', 'x')}")

    return r


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(client: httpx.AsyncClient) -> Samples:
    response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"] == metrics.CONTENT_TYPE_LATEST
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(response.text)
            for s in family.samples}


def value(samples: Samples, metric: str, /, **labels: str) -> float:
    return samples[(metric, frozenset(labels.items()))]


async def test_metrics_after_real_work(client: httpx.AsyncClient, engine: AsyncEngine,
                                       db_url: str, conn: asyncpg.Connection) -> None:
    async with engine.begin() as c:
        await enqueue_many(c, "ok", [{}] * 3)
        await enqueue_many(c, "bad", [{"kind": "a"}, {"kind": "a"}, {"kind": "b"}],
                           max_retries=1)
    await drain(db_url, registry=registry(), retry_policy=RetryPolicy(base=0, jitter=0))
    # Waiting: one job due 42 s ago, one scheduled for later (not waiting yet).
    await conn.execute("INSERT INTO jobs (job_type, run_at) VALUES "
                       "('ok', now() - interval '42 seconds'), ('ok', now() + interval '1 hour')")

    s = await scrape(client)
    assert value(s, "jobqueue_jobs", status="completed", queue="default", job_type="ok") == 3
    assert value(s, "jobqueue_jobs", status="pending", queue="default", job_type="ok") == 2
    assert value(s, "jobqueue_jobs", status="failed", queue="default", job_type="bad") == 3
    assert value(s, "jobqueue_jobs", status="retrying", queue="default",
                 job_type="bad") == 0  # zeros too
    assert 42 <= value(s, "jobqueue_oldest_pending_age_seconds") < 100

    assert value(s, "jobqueue_recent_window_seconds") == 60
    assert value(s, "jobqueue_completed_recent", job_type="ok") == 3
    assert value(s, "jobqueue_completed_recent", job_type="bad") == 0
    assert value(s, "jobqueue_failed_recent", job_type="bad") == 3
    assert value(s, "jobqueue_failed_attempts_recent", job_type="bad") == 6  # 2 attempts each
    assert value(s, "jobqueue_retries_recent", job_type="bad") == 3  # the first of each
    assert value(s, "jobqueue_throughput_jobs_per_second") == pytest.approx(6 / 60)

    for name in ("jobqueue_wait_seconds", "jobqueue_run_seconds"):
        for job_type, n in (("ok", 3), ("bad", 3)):
            buckets = [value(s, f"{name}_bucket", job_type=job_type, le=le)
                       for le in [*map(str, metrics.BUCKETS), "+Inf"]]
            assert buckets == sorted(buckets) and buckets[-1] == n  # cumulative, all counted
            assert value(s, f"{name}_gcount", job_type=job_type) == n
            assert value(s, f"{name}_gsum", job_type=job_type) >= 0
    # No-op handlers: every run of this test's jobs took less than a second.
    assert value(s, "jobqueue_run_seconds_bucket", job_type="ok", le="1.0") == 3

    assert value(s, "jobqueue_jobs_table_live_tuples") >= 0
    assert value(s, "jobqueue_jobs_table_last_autovacuum_timestamp_seconds") >= 0
    assert value(s, "jobqueue_workers", state="active") == 0  # the drain has ended

    # Every claim and finish left a dead row version; the statistics catch up.
    async def dead_tuples() -> float:
        return value(await scrape(client), "jobqueue_jobs_table_dead_tuples")

    assert await wait_for(dead_tuples, timeout=15, message="dead tuples counted") > 0


async def test_histogram_buckets_count_values_at_or_below_their_bound(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    # Finished jobs with exact timings: waits of 5 ms (on a bound), 5.001 ms and
    # 2 minutes (past the last bound); each ran for 0.25 s (also on a bound).
    await conn.execute("""
        INSERT INTO jobs (job_type, status, created_at, run_at, started_at, completed_at)
        SELECT 'exact', 'completed', t - w, t - w, t, t + interval '250 ms'
        FROM (SELECT now() - interval '10 seconds' AS t) AS base,
             unnest(ARRAY[interval '5 ms', interval '5001 microseconds',
                          interval '2 minutes']) AS w""")
    s = await scrape(client)

    def bucket(name: str, le: str) -> float:
        return value(s, f"{name}_bucket", job_type="exact", le=le)

    assert bucket("jobqueue_wait_seconds", "0.0025") == 0
    assert bucket("jobqueue_wait_seconds", "0.005") == 1
    assert bucket("jobqueue_wait_seconds", "0.01") == 2
    assert bucket("jobqueue_wait_seconds", "60.0") == 2
    assert bucket("jobqueue_wait_seconds", "+Inf") == 3
    assert value(s, "jobqueue_wait_seconds_gsum", job_type="exact") == pytest.approx(120.010001)
    assert bucket("jobqueue_run_seconds", "0.1") == 0
    assert bucket("jobqueue_run_seconds", "0.25") == 3
    assert value(s, "jobqueue_run_seconds_gsum", job_type="exact") == pytest.approx(0.75)


async def test_jobs_outside_the_window_are_not_recent(client: httpx.AsyncClient,
                                                       conn: asyncpg.Connection) -> None:
    await conn.execute("""
        INSERT INTO jobs (job_type, status, started_at, completed_at, error_history)
        VALUES ('old', 'completed', now() - interval '2 minutes', now() - interval '61 seconds',
                jsonb_build_array(jsonb_build_object(
                    'attempt', 1, 'error', 'E', 'at', now() - interval '90 seconds')))""")
    s = await scrape(client)
    assert value(s, "jobqueue_jobs", status="completed", queue="default", job_type="old") == 1
    assert value(s, "jobqueue_completed_recent", job_type="old") == 0
    assert value(s, "jobqueue_failed_attempts_recent", job_type="old") == 0
    assert ("jobqueue_wait_seconds_gcount", frozenset({("job_type", "old")})) not in s


async def test_the_active_worker_is_reported(client: httpx.AsyncClient, db_url: str) -> None:
    runner = JobRunner(db_url, registry=registry(), install_signal_handlers=False)
    task = asyncio.create_task(runner.run())
    try:
        await asyncio.wait_for(runner.wait_active(), 10)

        async def reported() -> Samples | None:
            s = await scrape(client)
            return s if value(s, "jobqueue_workers", state="active") == 1 else None

        s = await wait_for(reported, timeout=10, message="active worker in the metrics")
        assert value(s, "jobqueue_workers", state="standby") == 0
        assert value(s, "jobqueue_active_worker_info", worker_id=str(runner.worker_id),
                     name=runner.name) == 1
        age = value(s, "jobqueue_worker_heartbeat_age_seconds",
                    worker_id=str(runner.worker_id), name=runner.name)
        assert 0 <= age < runner.config.lease
    finally:
        runner.stop()
        await asyncio.wait_for(task, 30)

    async def gone() -> Samples | None:  # a scrape may be a second old (api.SHARED_TTL)
        s = await scrape(client)
        return s if value(s, "jobqueue_workers", state="active") == 0 else None

    s = await wait_for(gone, timeout=10, message="no active worker in the metrics")
    assert not any(name == "jobqueue_active_worker_info" for name, _ in s)


async def test_an_empty_queue_scrapes_cleanly(client: httpx.AsyncClient) -> None:
    s = await scrape(client)
    assert value(s, "jobqueue_oldest_pending_age_seconds") == 0
    assert value(s, "jobqueue_throughput_jobs_per_second") == 0
    assert not any(name == "jobqueue_jobs" for name, _ in s)  # no types, no rows


# -- jobqueue status ---------------------------------------------------------------------


async def test_status_lists_the_most_frequent_recent_errors(
    engine: AsyncEngine, db_url: str, conn: asyncpg.Connection
) -> None:
    async with engine.begin() as c:
        await enqueue_many(c, "bad", [{"kind": "a"}] * 3 + [{"kind": "b"}], max_retries=1)
        await enqueue_many(c, "ok", [{}] * 2)
    await drain(db_url, registry=registry(), retry_policy=RetryPolicy(base=0, jitter=0))
    await conn.execute("INSERT INTO jobs (job_type, run_at) "
                       "VALUES ('ok', now() - interval '30 seconds')")

    summary = await report.queue_summary(conn, window=300)
    errors = summary["recent"]["top_errors"]
    assert [(e["job_type"], e["error"], e["count"]) for e in errors] == [
        ("bad", "ValueError: bad input a", 6), ("bad", "ValueError: bad input b", 2)]
    assert all(e["last_at"] for e in errors)
    assert 30 <= summary["oldest_pending_age_seconds"] < 90

    text = format_summary(summary)
    assert "most frequent errors, last 300 s" in text
    lines = text.splitlines()
    first = lines.index("most frequent errors, last 300 s")
    assert lines[first + 1].split() == ["6", "x", "bad:", "ValueError:", "bad", "input", "a"]
    assert "oldest due  waiting for" in text


async def test_status_without_errors_says_nothing_about_them(conn: asyncpg.Connection) -> None:
    summary = await report.queue_summary(conn, window=300)
    assert summary["recent"]["top_errors"] == [] and summary["oldest_pending_age_seconds"] is None
    text = format_summary(summary)
    assert "most frequent errors" not in text and "oldest due  none waiting" in text


async def test_long_errors_are_cut_to_one_line(conn: asyncpg.Connection) -> None:
    error = "Traceback line one\n" + "y" * 300
    await conn.execute("""
        INSERT INTO jobs (job_type, status, retry_count, run_at, error_history)
        VALUES ('t', 'retrying', 1, now() + interval '1 hour', jsonb_build_array(
            jsonb_build_object('attempt', 1, 'error', $1::text, 'at', now())))""", error)
    text = format_summary(await report.queue_summary(conn, window=300))
    line = next(ln for ln in text.splitlines() if "Traceback" in ln)
    assert "Traceback line one yyy" in line and line.endswith("…") and len(line) < 120


# -- queues and the jobs no live worker takes (#18) -------------------------------------


async def add_worker(conn: asyncpg.Connection, worker_id: int, state: str,
                     queues: list[str] | None, job_types: list[str],
                     silent_for: float = 0.0) -> None:
    """A worker's row as a live one writes it (no process behind it: nothing
    here fences it, and the readers look only at the row)."""
    await conn.execute(
        "INSERT INTO jobqueue_workers (id, name, mode, state, queues, job_types, heartbeat_at) "
        "VALUES ($1, $2, 'shared', $3, $4, $5, now() - make_interval(secs => $6))",
        worker_id, f"host:{worker_id}", state, queues, job_types, silent_for)


async def routed_jobs(conn: asyncpg.Connection) -> None:
    """Due jobs in several queues and types, one not due, one of them running."""
    await conn.execute("""
        INSERT INTO jobs (job_type, queue, run_at, status) VALUES
            ('a', 'default', now() - interval '5 seconds', 'pending'),
            ('a', 'held', now() - interval '5 seconds', 'pending'),
            ('b', 'mail', now() - interval '5 seconds', 'pending'),
            ('b', 'default', now() - interval '30 seconds', 'pending'),
            ('b', 'default', now() - interval '20 seconds', 'retrying'),
            ('c', 'default', now() - interval '10 seconds', 'pending'),
            ('d', 'default', now() - interval '40 seconds', 'pending'),
            ('e', 'default', now() + interval '1 hour', 'pending'),
            ('a', 'default', now() - interval '1 minute', 'processing')""")
    await add_worker(conn, 1, "shared", None, ["a", "e"])          # every queue
    await add_worker(conn, 2, "shared", ["mail"], ["b"])           # b, but only in mail
    await add_worker(conn, 3, "shared", None, ["c"], silent_for=60)  # silent: gone
    await add_worker(conn, 4, "standby", None, ["d"])              # takes nothing yet


async def test_jobs_no_live_worker_takes_are_counted_by_queue_and_type(
    client: httpx.AsyncClient, engine: AsyncEngine, conn: asyncpg.Connection
) -> None:
    await routed_jobs(conn)
    async with engine.begin() as c:
        await queues.pause(c, "held")
        await queues.limit(c, "mail", concurrency=3, rate="90/m")

    s = await scrape(client)
    unserved = {(dict(k)["queue"], dict(k)["job_type"]): v for (name, k), v in s.items()
                if name == "jobqueue_unserved_jobs"}
    # Every (queue, type) with due jobs is there; b in default is served by no
    # one (worker 2 serves mail only), c's worker fell silent, d's is a standby.
    # a in the paused queue is served (it waits for the resume, not for a worker).
    assert unserved == {("default", "a"): 0, ("held", "a"): 0, ("mail", "b"): 0,
                        ("default", "b"): 2, ("default", "c"): 1, ("default", "d"): 1}
    oldest = value(s, "jobqueue_unserved_oldest_age_seconds", queue="default", job_type="b")
    assert 30 <= oldest < 90
    assert value(s, "jobqueue_unserved_oldest_age_seconds", queue="mail", job_type="b") == 0
    assert value(s, "jobqueue_jobs", status="retrying", queue="default", job_type="b") == 1
    assert value(s, "jobqueue_jobs", status="pending", queue="held", job_type="a") == 1

    assert value(s, "jobqueue_queue_paused", queue="held") == 1
    assert value(s, "jobqueue_queue_paused", queue="default") == 0
    assert value(s, "jobqueue_queue_concurrency_limit", queue="mail") == 3
    assert value(s, "jobqueue_queue_rate_limit_per_second", queue="mail") == 1.5
    assert ("jobqueue_queue_concurrency_limit", frozenset({("queue", "held")})) not in s

    summary = await report.queue_summary(conn, window=300)
    assert [(u["queue"], u["job_type"], u["count"]) for u in summary["unserved"]] == [
        ("default", "d", 1), ("default", "b", 2), ("default", "c", 1)]  # oldest first
    by_name = {q["queue"]: q for q in summary["queues"]}
    assert by_name["default"]["running"] == 1 and by_name["default"]["counts"]["pending"] == 5
    assert by_name["held"]["paused"] and by_name["mail"]["rate"] == "90/m"
    assert {w["id"]: (w["queues"], w["job_types"]) for w in summary["workers"]}[2] == (
        ["mail"], ["b"])

    text = format_summary(summary)
    lines = text.splitlines()
    first = lines.index("waiting jobs no live worker takes (none serves the queue with a "
                        "handler for the type)")
    assert lines[first + 1].split()[:6] == ["1", "x", "d", "in", "queue", "default,"]
    assert lines[first + 1].endswith("s ago") and len(lines[first + 1:first + 4]) == 3
    held = next(line for line in lines if line.startswith("  held "))
    assert held.split()[1] == "1" and held.endswith("paused")


async def test_without_waiting_jobs_nothing_is_unserved(conn: asyncpg.Connection) -> None:
    await conn.execute("INSERT INTO jobs (job_type, status, completed_at) "
                       "VALUES ('a', 'completed', now())")
    summary = await report.queue_summary(conn, window=300)
    assert summary["unserved"] == [] and [q["queue"] for q in summary["queues"]] == ["default"]
    assert "no live worker" not in format_summary(summary)


async def test_job_types_past_the_hundred_with_most_jobs_are_summed_as_other(
        client: httpx.AsyncClient, conn: asyncpg.Connection) -> None:
    """Issue 31, item 5: any client could enqueue endless new types, each a
    new series of every per-type family."""
    from jobqueue.ops.metrics import MAX_JOB_TYPES, OTHER_TYPES

    # 100 types of 3 jobs each, then 150 types of one job: 250 in all.
    await conn.execute("""
        INSERT INTO jobs (job_type, payload)
        SELECT CASE WHEN g <= 300 THEN 'big_' || (g % 100) ELSE 'one_' || g END, '{}'
        FROM generate_series(1, 450) AS g""")
    s = await scrape(client)
    named = {dict(labels)["job_type"] for name, labels in s if name == "jobqueue_jobs"}
    assert len(named) == MAX_JOB_TYPES + 1 and OTHER_TYPES in named
    assert {f"big_{i}" for i in range(100)} <= named  # the ones with most jobs keep their name
    assert value(s, "jobqueue_jobs", status="pending", queue="default",
                 job_type=OTHER_TYPES) == 150
    total = sum(v for (name, labels), v in s.items()
                if name == "jobqueue_jobs" and dict(labels)["status"] == "pending")
    assert total == 450  # nothing lost in the sum
    unserved = {dict(labels)["job_type"] for name, labels in s
                if name == "jobqueue_unserved_jobs"}
    assert len(unserved) == MAX_JOB_TYPES + 1
