"""The counts the operator's tools show, and what they cost (issue #34).

Unfinished jobs are counted exactly, from the indexes that hold only them;
finished ones are counted while there are few and estimated past
`routing.EXACT_FINISHED`, and every surface says which figures are
estimates. (That no statement here passes over the table is shown on a
million rows in `test_dashboard_plans.py`.)
"""

from __future__ import annotations

import json
import re

import asyncpg
import httpx

from jobqueue.ops import routing
from jobqueue.ops import status as report
from jobqueue.ops.cli import format_summary
from tests.conftest import run_cli
from tests.test_metrics import scrape, value

#: Past the exact count: the finished jobs the surfaces must estimate.
MANY = routing.EXACT_FINISHED + 10_000


async def finished_jobs(conn: asyncpg.Connection, n: int, *, queue: str = "default",
                        every_failed: int = 10) -> None:
    """`n` finished jobs of types a and b (one in `every_failed` failed),
    completed over the last day."""
    await conn.execute("""
        INSERT INTO jobs (job_type, queue, status, created_at, run_at, started_at,
                          completed_at)
        SELECT CASE WHEN i % 2 = 0 THEN 'a' ELSE 'b' END, $2,
               CASE WHEN i % $3 = 0 THEN 'failed' ELSE 'completed' END, t, t, t, t
        FROM generate_series(1, $1) AS i,
             LATERAL (SELECT now() - i * interval '1 s' AS t) AS at""", n, queue, every_failed)


async def test_pending_and_retrying_are_told_apart(conn: asyncpg.Connection) -> None:
    """idx_jobs_pickable holds both without their status: the retrying ones
    are counted from their own index, and pending is the rest, exactly."""
    await conn.execute("""
        INSERT INTO jobs (job_type, queue, status, run_at, retry_count) VALUES
            ('a', 'q', 'pending', now() - interval '10 s', 0),
            ('a', 'q', 'pending', now() + interval '1 h', 0),
            ('a', 'q', 'retrying', now() - interval '50 s', 1),
            ('a', 'q', 'retrying', now() + interval '1 h', 2),
            ('b', 'q', 'retrying', now() - interval '5 s', 1),
            ('a', 'q', 'processing', now(), 0)""")
    routes = await routing.read(conn)
    by = {(g.status, g.job_type): g for g in routes.groups}
    assert (by["pending", "a"].n, by["pending", "a"].due) == (2, 1)
    assert (by["retrying", "a"].n, by["retrying", "a"].due) == (2, 1)
    assert (by["retrying", "b"].n, by["retrying", "b"].due) == (1, 1)
    assert ("pending", "b") not in by  # none pending: no group, not a zero
    assert by["processing", "a"].n == 1
    assert routes.counts() == {"pending": 2, "processing": 1, "completed": 0, "failed": 0,
                               "retrying": 3}
    # the longest-waiting due job is a retrying one, 50 s overdue
    assert 50 <= (routes.oldest_due_age() or 0) < 80
    assert routes.estimated == ()


async def test_finished_jobs_are_counted_while_few(conn: asyncpg.Connection) -> None:
    await finished_jobs(conn, 1_000)
    await conn.execute("ANALYZE jobs")
    routes = await routing.read(conn)
    assert routes.estimated == ()
    assert routes.counts()["completed"] == 900 and routes.counts()["failed"] == 100


async def test_past_the_count_finished_jobs_are_estimated(conn: asyncpg.Connection) -> None:
    await finished_jobs(conn, 700, queue="q1")
    await finished_jobs(conn, 300, queue="q2")
    await conn.execute("INSERT INTO jobs (job_type, queue) SELECT 'a', 'q1' "
                       "FROM generate_series(1, 5)")
    # No statistics yet (never analyzed): nothing to estimate from, so counted.
    routes = await routing.read(conn, exact_finished=100)
    assert routes.estimated == () and routes.counts()["completed"] == 900

    await conn.execute("ANALYZE jobs")  # a sample of every row: the shares are exact
    routes = await routing.read(conn, exact_finished=100)
    assert routes.estimated == ("completed", "failed")
    counts = routes.counts()
    assert counts["pending"] == 5  # counted, whatever the finished ones
    assert abs(counts["completed"] - 900) <= 9 and abs(counts["failed"] - 100) <= 2
    queues = {q["queue"]: q["counts"] for q in routes.queues()}
    assert abs(queues["q1"]["completed"] - 630) <= 7 and abs(queues["q2"]["completed"] - 270) <= 3


async def test_every_surface_says_which_counts_are_estimates(
        conn: asyncpg.Connection, client: httpx.AsyncClient, db_url: str) -> None:
    await finished_jobs(conn, MANY)
    await conn.execute("INSERT INTO jobs (job_type) VALUES ('a')")
    await conn.execute("ANALYZE jobs")
    assert await conn.fetchval("SELECT count(*) FROM jobs WHERE completed_at IS NOT NULL") \
        > routing.EXACT_FINISHED  # too many to count

    summary = await report.queue_summary(conn)
    assert summary["estimated"] == ["completed", "failed"]
    assert summary["counts"]["pending"] == 1
    # ANALYZE samples 30,000 of the rows: within a few per cent
    assert abs(summary["counts"]["completed"] - MANY * 0.9) < MANY * 0.05
    text = format_summary(summary)
    assert re.search(r"completed +~[\d,]+\n", text) and re.search(r"pending +1\n", text)
    assert "~ an estimate from PostgreSQL's statistics" in text

    s = await scrape(client)
    assert value(s, "jobqueue_jobs_estimated", status="completed") == 1
    assert value(s, "jobqueue_jobs_estimated", status="pending") == 0
    # type a: every other job, and every failed one (each tenth)
    assert abs(value(s, "jobqueue_jobs", status="completed", queue="default", job_type="a")
               - MANY * 0.4) < MANY * 0.05

    assert (await client.get("/queues")).json()["estimated"] == ["completed", "failed"]
    html = (await client.get("/")).text
    assert re.search(r'data-status="completed" title="[^"]*">≈[\d,]+<', html)
    assert '<span class="n" data-status="pending">1</span>' in html

    done = run_cli("status", "--json", url=db_url)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["estimated"] == ["completed", "failed"]


async def test_failed_attempts_of_unfinished_jobs_are_recent_errors(
        conn: asyncpg.Connection) -> None:
    """A job waiting for its retry, or running it, holds failed attempts
    that no finished job shows: they are read from their own indexes."""
    attempt = ("jsonb_build_array(jsonb_build_object('attempt', 1, 'error', 'ValueError: x', "
               "'at', now() - interval '3 s'))")
    await conn.execute(f"""
        INSERT INTO jobs (job_type, status, retry_count, run_at, error_history, worker_id)
        VALUES ('a', 'retrying', 1, now() + interval '1 min', {attempt}, NULL),
               ('a', 'processing', 1, now(), {attempt}, 7)""")
    summary = await report.queue_summary(conn, window=60)
    assert summary["recent"]["failed_attempts"] == 2
    assert summary["recent"]["top_errors"][0]["count"] == 2
