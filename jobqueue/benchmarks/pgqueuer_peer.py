"""PgQueuer as a peer: installed by `Queries.install()` (what `pgq install`
runs) at its default durability, `durable` (every table logged, as
jobqueue's), then `Queries.optimize_autovacuum()` (`pgq autovac`, which its
performance guide says to run after installing); its worker is
`peer_worker.py pgqueuer`. It deletes a finished job from its queue, so its
log (`pgqueuer_log`: rows `queued`, `picked`, `successful`) is the record."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from jobqueue.benchmarks import adapter, scenarios
from jobqueue.benchmarks.peer_worker import NOOP

SYSTEM = "pgqueuer"
DRAIN_SQL = """
    SELECT count(*) FILTER (WHERE status = 'successful') AS completed,
           count(DISTINCT job_id) FILTER (WHERE status = 'successful') AS distinct_completed,
           count(*) FILTER (WHERE status = 'queued') AS total,
           (SELECT count(*) FROM pgqueuer) AS left_in_queue,
           extract(epoch FROM min(created) FILTER (WHERE status = 'picked')) AS first,
           extract(epoch FROM max(created) FILTER (WHERE status = 'successful')) AS last
    FROM pgqueuer_log"""


async def install(url: str) -> None:
    from pgqueuer import Queries

    async with scenarios.connected(url) as conn:
        queries = Queries.from_asyncpg_connection(conn)
        await queries.install()
        await queries.optimize_autovacuum()


async def fill(url: str, n: int, handler: str) -> None:
    """`Queries.enqueue` with lists (one statement per chunk), so the queue
    and its log hold exactly what its producers would write."""
    from pgqueuer import Queries

    payloads = [p if p is None else json.dumps(p).encode() for p in adapter.arguments(n, handler)]
    async with scenarios.connected(url) as conn:
        queries = Queries.from_asyncpg_connection(conn)
        for chunk in adapter.chunks(payloads):
            await queries.enqueue([handler] * len(chunk), list(chunk), [0] * len(chunk))


def enqueue_one(pool: asyncpg.Pool) -> Callable[[], Awaitable[Any]]:
    """`Queries.enqueue(entrypoint, payload)` on a pool, as its guide advises
    for producers."""
    from pgqueuer import Queries

    queries = Queries.from_asyncpg_pool(pool)
    return lambda: queries.enqueue(NOOP, None)


PEER = adapter.python_peer(
    SYSTEM, "batch_size", "batch", install=install,
    truncate="TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics",
    tables=("pgqueuer", "pgqueuer_log"), fill=fill,
    drained=adapter.logged(DRAIN_SQL),
    enqueue_one=enqueue_one,
    jobs_sql=adapter.events_sql("pgqueuer_log", "created", "status",
                                ("queued", "picked", "successful")),
    recommended=(
        "Its performance guide: raise `batch_size` (default 10) when jobs are short-lived "
        "(under a second), without giving a number; `max_concurrent_tasks` unset (no cap; "
        "if set, at least twice the batch); the `durable` default; `pgq autovac` after "
        "installing; a dedicated asyncpg connection for the worker. Its deployment guide: one "
        "worker process per CPU core for CPU-bound work. Its benchmark tool runs 5 queue "
        "managers of batch 10 in one process.",
        (("performance tuning", "https://janbjorge.github.io/pgqueuer/guides/performance-tuning/"),
         ("deployment", "https://janbjorge.github.io/pgqueuer/guides/deployment/"),
         ("benchmarks", "https://janbjorge.github.io/pgqueuer/comparisons/benchmarks/"))))
