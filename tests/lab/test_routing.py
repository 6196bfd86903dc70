"""Lesson 07's section 9 helpers (jobqueue.lab.routing) against the real database."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import matplotlib
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from jobqueue import HandlerRegistry, enqueue, enqueue_many, queues
from jobqueue.lab import routing, slow_jobs, tour
from jobqueue.testing import drain
from jobqueue.worker.scheduler import Scheduler

matplotlib.use("Agg")

BASE = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


async def ran_between(conn: asyncpg.Connection, *spans: tuple[float, float | None]
                      ) -> list[uuid.UUID]:
    """Jobs that started and ended at these seconds after BASE (None: still running)."""
    ids = []
    for start, end in spans:
        ids.append(await conn.fetchval(
            "INSERT INTO jobs (job_type, status, started_at, completed_at) "
            "VALUES ('t', CASE WHEN $2::timestamptz IS NULL THEN 'processing' "
            "ELSE 'completed' END, $1, $2) RETURNING id",
            BASE + timedelta(seconds=start),
            None if end is None else BASE + timedelta(seconds=end)))
    return ids


def test_times_of_the_lesson_s_day() -> None:
    assert routing.utc("10:00:59.9") == datetime(2026, 12, 1, 10, 0, 59, 900_000, UTC)
    assert routing.time_of_day(routing.utc("10:07:00")) == "10:07:00"
    tokyo = datetime.fromisoformat("2026-12-01T19:07:00+09:00")  # 10:07 UTC
    assert routing.time_of_day(tokyo) == "10:07:00"
    other_day = datetime(2026, 12, 2, 10, 7, tzinfo=UTC)  # shown whole: the sanitizer sees it
    assert routing.time_of_day(other_day) == "2026-12-02T10:07:00+00:00"
    assert routing.time_of_day(None) == ""


async def test_the_run_order_is_priority_then_due_time_within_the_served_queue(
    engine: AsyncEngine, db_url: str, conn: asyncpg.Connection
) -> None:
    plan = [("a", "emails", 0), ("b", "emails", 10), ("c", "emails", 5), ("d", "emails", 0),
            ("e", "emails", 5), ("r", "reports", 20)]
    jobs = {}
    for label, queue, priority in plan:  # a transaction each: each due after the one before
        async with AsyncSession(engine) as s, s.begin():
            jobs[label] = await enqueue(s, "send_email", {"to": label}, queue=queue,
                                        priority=priority)
    report = await drain(db_url, registry=tour.lesson_registry(), queues="emails",
                         concurrency=1, quick_batch=0, batch_size=1)
    assert report["processed"] == 5

    table = await routing.run_order(conn, jobs)
    assert list(table["job"]) == list(jobs)  # as enqueued
    assert list(table["ran"]) == [4, 1, 2, 5, 3, ""]
    assert routing.ran_in_order(table) == ["b", "c", "e", "a", "d"]
    assert routing.by_priority(table, "emails") == routing.ran_in_order(table)
    assert table.set_index("job").loc["r", "status"] == "pending"


async def test_most_at_once_sweeps_the_jobs_own_timestamps(conn: asyncpg.Connection) -> None:
    nested = await ran_between(conn, (0, 10), (1, 9), (2, 8))
    assert await routing.most_at_once(conn, nested) == 3
    # One ends exactly as the next starts: never side by side.
    chained = await ran_between(conn, (20, 30), (30, 40), (40, 50))
    assert await routing.most_at_once(conn, chained) == 1
    # Only the given jobs count, and only finished ones.
    running = await ran_between(conn, (21, None), (22, None))
    assert await routing.most_at_once(conn, chained + running) == 1
    assert await routing.most_at_once(conn, []) == 0

    spans = await routing.spans(conn, nested)
    assert spans.to_dict("records") == [{"start": 0.0, "end": 10.0}, {"start": 1.0, "end": 9.0},
                                       {"start": 2.0, "end": 8.0}]
    grid, most = routing.running_at_once(spans, step=0.5)
    assert int(most.max()) == 3 and most[0] == 1 and grid[0] == 0.0
    figure = routing.plot_spans({"nested": spans,
                                 "chained": await routing.spans(conn, chained)})
    assert len(figure.axes) == 4  # two panels, each with its count beside it


async def test_a_limit_holds_for_a_worker_with_more_lanes(
    engine: AsyncEngine, db_url: str, conn: asyncpg.Connection
) -> None:
    await slow_jobs.create_tables(conn)
    registry = tour.lesson_registry()
    async with AsyncSession(engine) as s, s.begin():
        free = await enqueue_many(s, "slow_write", [{"seconds": 0.05}] * 12, queue="uploads")
    await drain(db_url, registry=registry, queues={"uploads": 4})
    assert await routing.most_at_once(conn, free) > 2  # the lanes can pass the limit below

    async with AsyncSession(engine) as s, s.begin():
        await queues.limit(s, "uploads", concurrency=2)
        ids = await enqueue_many(s, "slow_write", [{"seconds": 0.05}] * 12, queue="uploads")
    assert await routing.queue_settings(conn) == [
        {"name": "uploads", "paused": False, "concurrency": 2, "rate_limit": None,
         "rate_period": None}]
    await drain(db_url, registry=registry, queues={"uploads": 4})
    assert (await tour.jobs_health(conn, ids))["completed"] == 12
    assert 1 <= await routing.most_at_once(conn, ids) <= 2

    async with AsyncSession(engine) as s, s.begin():
        await queues.limit(s, "uploads", concurrency=None)
    assert await routing.queue_settings(conn) == []


async def test_a_schedule_s_row_and_jobs_read_as_times_of_the_day(
    db_url: str, conn: asyncpg.Connection
) -> None:
    clock = HandlerRegistry()
    clock.register("tick", every=60, queue="maintenance", priority=5)(routing.tick)
    scheduler = Scheduler(clock.schedules)
    assert await scheduler.run_once(conn, now=routing.utc("10:00:30")) == 0
    assert (await routing.schedule_rows(conn)).to_dict("records") == [
        {"job_type": "tick", "schedule": "every 60s", "last_tick": "10:00:00"}]
    assert await routing.tick_outcome(conn, "tick") == {"jobs": 0, "ticks": []}

    assert await scheduler.run_once(conn, now=routing.utc("10:01:00")) == 1
    assert await Scheduler(clock.schedules).run_once(conn, now=routing.utc("10:01:30")) == 0
    assert await scheduler.run_once(conn, now=routing.utc("10:07:45")) == 1
    jobs = await routing.scheduled_jobs(conn, "tick")
    assert jobs.to_dict("records") == [
        {"tick": t, "payload": f'{{"tick": "2026-12-01T{t}+00:00"}}', "queue": "maintenance",
         "priority": 5, "status": "pending", "unique_key": f"schedule:tick:2026-12-01T{t}+00:00"}
        for t in ("10:01:00", "10:07:00")]
    assert await routing.tick_outcome(conn, "tick") == {"jobs": 2,
                                                        "ticks": ["10:01:00", "10:07:00"]}

    # The jobs are ordinary ones: a worker with the handler (and no schedule) runs them.
    runner = HandlerRegistry()
    runner.add("tick", routing.tick)
    assert not runner.schedules
    assert (await drain(db_url, registry=runner, queues="maintenance"))["processed"] == 2
    results = await conn.fetch("SELECT result ->> 'ran_for' AS tick FROM jobs ORDER BY tick")
    assert [r["tick"] for r in results] == ["2026-12-01T10:01:00+00:00",
                                            "2026-12-01T10:07:00+00:00"]
