"""A peer queue's worker in a process of its own, for the comparison benchmark.

    python -P jobqueue/benchmarks/peer_worker.py pgqueuer --batch-size 10 [--drain]
    python -P jobqueue/benchmarks/peer_worker.py procrastinate --concurrency 10 [--drain]

`jobqueue.benchmarks.peers` starts it by path, never as
`-m jobqueue.benchmarks.peer_worker`: importing the jobqueue package would load
SQLAlchemy into the peer's process and inflate the resident memory the lab
reports for it. So this file imports nothing from jobqueue, and `-P` keeps its
own folder off `sys.path`. The database comes from the libpq environment
variables (PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE), which asyncpg and
psycopg both read.

Each peer runs the way its documentation shows, with one no-op job type:

- PgQueuer: `pgqueuer.run(factory, batch_size=…, mode=…)`, the documented way
  to start from Python what `pgq run` starts (the `pgq` command itself crashes
  under typer 0.29 here). The factory yields
  `PgQueuer.from_asyncpg_connection(conn)` on a dedicated asyncpg connection,
  as its performance guide advises for the worker. `--drain` is its own
  `QueueExecutionMode.drain`: exit once the queue is empty.
- Procrastinate: `App(connector=PsycopgConnector(…))` with an async task,
  `app.run_worker_async(concurrency=N, wait=not drain)`. The pool holds
  concurrency + 1 connections: its docs say that with short jobs the pool
  should hold as many connections as the concurrency, plus one.

Both stop cleanly on SIGTERM (their own signal handlers).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

NOOP = "noop"


async def run_pgqueuer(batch_size: int, drain: bool) -> None:
    import asyncpg
    import pgqueuer
    from pgqueuer import PgQueuer
    from pgqueuer.models import Job
    from pgqueuer.types import QueueExecutionMode

    @contextlib.asynccontextmanager
    async def factory() -> AsyncIterator[Any]:
        conn = await asyncpg.connect()
        try:
            pgq = PgQueuer.from_asyncpg_connection(conn)

            @pgq.entrypoint(NOOP)
            async def noop(job: Job) -> None:
                return None

            yield pgq
        finally:
            await conn.close()

    mode = QueueExecutionMode.drain if drain else QueueExecutionMode.continuous
    await pgqueuer.run(factory, batch_size=batch_size, mode=mode)


def procrastinate_app(concurrency: int, conninfo: str = "") -> Any:
    """The Procrastinate app with its no-op task (shared with the producer in
    `peers`, which passes the conninfo explicitly)."""
    import procrastinate

    size = concurrency + 1
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(
        conninfo=conninfo, min_size=size, max_size=size))

    @app.task(name=NOOP)
    async def noop() -> None:
        return None

    return app


async def run_procrastinate(concurrency: int, drain: bool) -> None:
    app = procrastinate_app(concurrency)
    async with app.open_async():
        await app.run_worker_async(concurrency=concurrency, wait=not drain)


def main() -> None:
    parser = argparse.ArgumentParser(description="A peer queue's worker, for the benchmark lab.")
    parser.add_argument("system", choices=["pgqueuer", "procrastinate"])
    parser.add_argument("--batch-size", type=int, default=10, help="PgQueuer's batch_size")
    parser.add_argument("--concurrency", type=int, default=1, help="Procrastinate's concurrency")
    parser.add_argument("--drain", action="store_true", help="exit once the queue is empty")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.system == "pgqueuer":
        asyncio.run(run_pgqueuer(args.batch_size, args.drain))
    else:
        asyncio.run(run_procrastinate(args.concurrency, args.drain))


if __name__ == "__main__":
    main()
