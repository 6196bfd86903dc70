"""A Python peer's worker in a process of its own (`peer_worker.py pgqueuer
--batch-size 10 [--drain]`, `… procrastinate --concurrency 10 [--drain]`).

Started by path with `python -P` and importing nothing from jobqueue:
jobqueue's package would load SQLAlchemy into the peer's process and
inflate the memory the lab reports for it (libpq's environment names the
database). Job types: `noop`; `write_row`, one row into `bench_rows`;
`process_payment`, the seed's handler (`jobqueue.lab.examples`, a balance
UPDATE and a payment INSERT in one transaction). Each task reaches the
database as its peer's docs show:

- PgQueuer: `pgqueuer.run(factory, batch_size=…, mode=…)`, what `pgq run`
  starts (the `pgq` command crashes under typer 0.29 here), on a dedicated
  asyncpg connection; `--drain` is `QueueExecutionMode.drain`; the tasks
  write through an asyncpg pool (default size, 10) passed as `resources=`.
- Procrastinate: `App(connector=PsycopgConnector(…))`, async tasks,
  `run_worker_async(concurrency=N, wait=not drain)`, a pool of
  concurrency + 1; `process_payment` takes a connection from that pool.

No peer can put a task's write in the transaction that records the job's
completion: each write commits first (a payment run again fails on its
primary key).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any, cast

NOOP = "noop"
WRITE_ROW = "write_row"
PROCESS_PAYMENT = "process_payment"
HANDLERS = (NOOP, WRITE_ROW, PROCESS_PAYMENT)
#: The table `write_row` fills in each peer's database (their job ids are bigints).
PEER_BENCH_TABLE = """CREATE TABLE IF NOT EXISTS bench_rows (
    job_id bigint NOT NULL, written_at timestamptz NOT NULL DEFAULT clock_timestamp())"""
#: `jobqueue.lab.examples.process_payment`'s two statements, in each driver's
#: placeholders (asyncpg `$n`, psycopg `%s`).
CREDIT = "UPDATE demo_users SET balance = balance + $1 WHERE id = $2 RETURNING balance"
RECORD = "INSERT INTO demo_payments (payment_id, user_id, amount) VALUES ($1, $2, $3)"
CREDIT_PSYCOPG = "UPDATE demo_users SET balance = balance + %s WHERE id = %s RETURNING balance"
RECORD_PSYCOPG = "INSERT INTO demo_payments (payment_id, user_id, amount) VALUES (%s, %s, %s)"


async def run_pgqueuer(batch_size: int, drain: bool) -> None:
    import asyncpg
    import pgqueuer
    from pgqueuer import PgQueuer
    from pgqueuer.models import Context, Job
    from pgqueuer.types import QueueExecutionMode

    @contextlib.asynccontextmanager
    async def factory() -> AsyncIterator[Any]:
        conn = await asyncpg.connect()
        pool = await asyncpg.create_pool()
        try:
            pgq = PgQueuer.from_asyncpg_connection(conn, resources={"pool": pool})

            @pgq.entrypoint(NOOP)
            async def noop(job: Job) -> None:
                return None

            @pgq.entrypoint(WRITE_ROW, accepts_context=True)
            async def write_row(job: Job, context: Context) -> None:
                await context.resources["pool"].execute(  # type: ignore[attr-defined]
                    "INSERT INTO bench_rows (job_id) VALUES ($1)", job.id)

            @pgq.entrypoint(PROCESS_PAYMENT, accepts_context=True)
            async def process_payment(job: Job, context: Context) -> None:
                payment = json.loads(job.payload or b"{}")
                user, amount = int(payment["user_id"]), Decimal(payment["amount"])
                shared = cast(asyncpg.Pool, context.resources["pool"])
                async with shared.acquire() as c, c.transaction():
                    if await c.fetchval(CREDIT, amount, user) is None:
                        raise LookupError(f"no user {user}")
                    await c.execute(RECORD, payment["payment_id"], user, amount)

            yield pgq
        finally:
            await pool.close()
            await conn.close()

    mode = QueueExecutionMode.drain if drain else QueueExecutionMode.continuous
    await pgqueuer.run(factory, batch_size=batch_size, mode=mode)


def procrastinate_app(concurrency: int, conninfo: str = "") -> Any:
    """The Procrastinate app with its tasks (its adapter fills through it too)."""
    import procrastinate

    size = concurrency + 1
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(
        conninfo=conninfo, min_size=size, max_size=size))

    @app.task(name=NOOP)
    async def noop() -> None:
        return None

    @app.task(name=WRITE_ROW, pass_context=True)
    async def write_row(context: procrastinate.JobContext) -> None:
        await context.app.connector.execute_query_async(
            "INSERT INTO bench_rows (job_id) VALUES (%(id)s)", id=context.job.id)

    @app.task(name=PROCESS_PAYMENT, pass_context=True)
    async def process_payment(context: procrastinate.JobContext, user_id: int, amount: str,
                              payment_id: str) -> None:
        pool = context.app.connector.pool  # type: ignore[attr-defined]
        async with pool.connection() as conn, conn.transaction():
            credited = await conn.execute(CREDIT_PSYCOPG, (Decimal(amount), user_id))
            if await credited.fetchone() is None:
                raise LookupError(f"no user {user_id}")
            await conn.execute(RECORD_PSYCOPG, (payment_id, user_id, Decimal(amount)))

    return app


async def run_procrastinate(concurrency: int, drain: bool) -> None:
    app = procrastinate_app(concurrency)
    async with app.open_async():
        await app.run_worker_async(concurrency=concurrency, wait=not drain)


def build_parser() -> argparse.ArgumentParser:
    """This worker's command line, which labels parse back too."""
    parser = argparse.ArgumentParser(description="A peer queue's worker, for the benchmark lab.")
    parser.add_argument("system", choices=["pgqueuer", "procrastinate"])
    parser.add_argument("--batch-size", type=int, default=10, help="PgQueuer's batch_size")
    parser.add_argument("--concurrency", type=int, default=1, help="Procrastinate's concurrency")
    parser.add_argument("--drain", action="store_true", help="exit once the queue is empty")
    return parser


def main() -> None:
    args = build_parser().parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.system == "pgqueuer":
        asyncio.run(run_pgqueuer(args.batch_size, args.drain))
    else:
        asyncio.run(run_procrastinate(args.concurrency, args.drain))


if __name__ == "__main__":
    main()
