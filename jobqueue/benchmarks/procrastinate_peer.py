"""Procrastinate as a peer: installed by `SchemaManager.apply_schema_async()`
(what `procrastinate schema --apply` runs), with the psycopg connector its
docs use throughout; its worker is `peer_worker.py procrastinate`. It keeps
its jobs (its default `delete_jobs="never"`) and writes an event row per
transition from triggers (`procrastinate_events`: `deferred`, `started`,
`succeeded`)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from jobqueue.benchmarks import adapter
from jobqueue.benchmarks.peer_worker import procrastinate_app

SYSTEM = "procrastinate"
DRAIN_SQL = """
    SELECT count(*) FILTER (WHERE status = 'succeeded') AS completed,
           count(*) FILTER (WHERE status = 'succeeded') AS distinct_completed,
           count(*) AS total,
           count(*) FILTER (WHERE status IN ('todo', 'doing')) AS left_in_queue,
           (SELECT extract(epoch FROM min(at)) FROM procrastinate_events
             WHERE type = 'started') AS first,
           (SELECT extract(epoch FROM max(at)) FROM procrastinate_events
             WHERE type = 'succeeded') AS last
    FROM procrastinate_jobs"""
#: The statement `Task.defer_async()` sends (its `defer_jobs` query, its own
#: SQL function). Through `defer_async` itself (psycopg and Procrastinate's
#: Python around it) one producer reached only about 530 of 1,000 jobs/s here
#: while the worker shared the two cores, so the rate asked for would not
#: have been the rate measured.
DEFER_SQL = ("SELECT unnest(procrastinate_defer_jobs_v1(ARRAY[ROW('default', 'noop', 0,"
             " NULL, NULL, '{}'::jsonb, NULL)::procrastinate_job_to_defer_v1]))")


@contextlib.asynccontextmanager
async def _app(url: str) -> AsyncIterator[Any]:
    app = procrastinate_app(1, adapter.conninfo(url))
    async with app.open_async():
        yield app


async def install(url: str) -> None:
    async with _app(url) as app:
        await app.schema_manager.apply_schema_async()


async def fill(url: str, n: int, handler: str) -> None:
    """`Task.batch_defer_async` (one statement per chunk)."""
    async with _app(url) as app:
        for chunk in adapter.chunks(adapter.arguments(n, handler, {})):
            await app.tasks[handler].batch_defer_async(*chunk)


PEER = adapter.python_peer(
    SYSTEM, "concurrency", "concurrency", install=install,
    truncate=("TRUNCATE procrastinate_jobs, procrastinate_events, "
              "procrastinate_periodic_defers, procrastinate_workers"),
    tables=("procrastinate_jobs", "procrastinate_events"), fill=fill,
    drained=adapter.logged(DRAIN_SQL),
    enqueue_one=lambda pool: lambda: pool.fetchval(DEFER_SQL),
    jobs_sql=adapter.events_sql("procrastinate_events", "at", "type",
                                ("deferred", "started", "succeeded")),
    recommended=(
        "Its docs: a worker runs one job at a time by default; for throughput, launch several "
        "workers, each in its own process, and give async tasks `concurrency` (their example: "
        "30); with short jobs the pool should hold as many connections as the concurrency, "
        "plus one.",
        (("concurrency",
          "https://procrastinate.readthedocs.io/en/stable/howto/production/concurrency.html"),
         ("pool size", "https://procrastinate.readthedocs.io/en/stable/discussions.html"
                       "#mind-the-size-of-your-postgresql-pool"))))
