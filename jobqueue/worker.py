"""The worker: one active runner, standbys that wait for its lock, lanes that
claim and run batches.

How a worker lives, top-down:

1. It opens a dedicated connection (never pooled) and takes a session-level
   advisory lock on its own id: as long as that lock exists, the worker is
   alive. PostgreSQL drops it the instant the connection dies.
2. It waits on the *active* advisory lock. Only one worker holds it; the others
   stand by, blocked inside `pg_advisory_lock`, and the first of them gets it
   the moment the holder's connection goes away.
3. Once active it LISTENs for new jobs, returns the jobs of dead workers to the
   queue, and starts `concurrency` lanes. Each lane has its own connection and
   loops: claim a batch (one statement, committed, so the jobs show as
   `processing`), run each handler in a savepoint of one batch transaction,
   record outcomes with two statements, commit once.
4. On SIGTERM/SIGINT it stops claiming, lets running handlers finish within the
   grace period, hands back jobs that did not start, and releases its locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import socket
import time
import uuid
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import asyncpg
from sqlalchemy import event
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from jobqueue import db
from jobqueue.models import ERROR_MESSAGE_MAX_LENGTH
from jobqueue.queries import queries
from jobqueue.registry import HandlerRegistry, handlers
from jobqueue.retry import RetryPolicy
from jobqueue.stats import WorkerStats

logger = logging.getLogger(__name__)

#: Advisory lock class of the queue's own locks; key 0 is the active worker.
LOCK_CLASS = 74_171
ACTIVE_KEY = 0
#: Advisory lock class of liveness locks; the key is the worker's id.
WORKER_LOCK_CLASS = 74_172
#: The channel new jobs are announced on (by a trigger on `jobs`).
CHANNEL = "jobqueue"


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    id: uuid.UUID
    job_type: str
    payload: str
    retry_count: int
    max_retries: int


    @property
    def attempt(self) -> int:
        """1 for the first run, 2 for the first retry, …"""
        return self.retry_count + 1


_current_job: ContextVar[ClaimedJob | None] = ContextVar("jobqueue_current_job", default=None)


def current_job() -> ClaimedJob:
    """The job the calling handler is running (its id, type, attempt).

    Handlers take (session, payload); this gives them the rest when they need
    it, for an idempotency key or a log line.
    """
    job = _current_job.get()
    if job is None:
        raise LookupError("current_job() is only available inside a handler")
    return job


class LostOwnership(Exception):
    """Another worker took jobs of this batch: none of its effects may commit."""


class SwallowedDatabaseError(Exception):
    """A handler caught a database error and returned as if it had succeeded.

    PostgreSQL has aborted the handler's savepoint by then, so none of its
    writes can commit; the job fails instead of pretending.
    """


#: Key in a lane connection's `info` dict: a statement on it failed.
_DB_ERROR = "jobqueue_db_error"


def _mark_db_error(context: Any) -> None:
    if context.connection is not None:
        context.connection.info[_DB_ERROR] = True


class _Outcomes:
    """What happened to the jobs of one batch, in the shape the SQL wants."""

    def __init__(self) -> None:
        self.done_ids: list[uuid.UUID] = []
        self.results: list[str | None] = []
        self.handler_times: list[float] = []
        self.failed_ids: list[uuid.UUID] = []
        self.errors: list[str] = []
        self.delays: list[float] = []
        self.retry: list[bool] = []
        self.not_started: list[uuid.UUID] = []


def _error_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text[:ERROR_MESSAGE_MAX_LENGTH]


def _encode_result(result: Any) -> str | None:
    if result is None:
        return None
    try:
        return json.dumps(result, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as e:
        raise TypeError(f"handler result is not JSON: {e}") from None


_CONNECTION_ERRORS = (OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError)


def _is_connection_error(exc: BaseException) -> bool:
    if isinstance(exc, DBAPIError):
        return bool(exc.connection_invalidated) or isinstance(exc.orig, _CONNECTION_ERRORS)
    return isinstance(exc, _CONNECTION_ERRORS)


class JobRunner:
    """Runs jobs until stopped; `await runner.run()` returns the stats report.

    concurrency: lanes, each with its own connection, running batches side by
        side (async handlers that wait on I/O overlap).
    batch_size: most jobs one lane claims and commits at once. Larger batches
        amortise commits (the dominant cost of a no-op job); a batch is
        whatever is due, up to this size, so a lone job never waits to fill one.
    poll_interval: longest sleep between looks at the table when no
        notification arrives (scheduled jobs and retries are woken for on time
        regardless).
    grace_period: seconds running handlers get to finish after SIGTERM before
        they are abandoned and their jobs handed back.
    burst: stop once nothing is due (tests, benchmarks, cron-style draining).
    """

    def __init__(
        self,
        database_url: str | None = None,
        *,
        registry: HandlerRegistry = handlers,
        concurrency: int = 1,
        batch_size: int = 100,
        poll_interval: float = 1.0,
        grace_period: float = 30.0,
        retry_policy: RetryPolicy | None = None,
        burst: bool = False,
        install_signal_handlers: bool = True,
        rescue_interval: float = 10.0,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if batch_size < 1:
            raise ValueError("batch size must be at least 1")
        if poll_interval <= 0:
            raise ValueError("poll interval must be positive")
        if grace_period < 0:
            raise ValueError("grace period must not be negative")
        self.database_url = database_url
        self.registry = registry
        self.concurrency = concurrency
        self.batch_size = batch_size
        self.poll_interval = poll_interval
        self.grace_period = grace_period
        self.retry_policy = retry_policy or RetryPolicy()
        self.burst = burst
        self.install_signal_handlers = install_signal_handlers
        self.rescue_interval = rescue_interval

        self.worker_id = 0
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        self.state = "new"
        self.stats = WorkerStats()
        self._stopping = asyncio.Event()
        self._abandon = asyncio.Event()
        self._active = asyncio.Event()
        self._wake = asyncio.Event()
        self._control: asyncpg.Connection | None = None
        self._control_lock = asyncio.Lock()
        self._lane_pids: dict[int, int] = {}

    # -- control from outside -------------------------------------------------

    def stop(self) -> None:
        """Ask the worker to stop: the first call is graceful, a second abandons
        running handlers at once (their jobs go back to the queue)."""
        if self._stopping.is_set():
            if not self._abandon.is_set():
                logger.warning("second stop request: abandoning running jobs")
                self._abandon.set()
            return
        logger.info("stop requested: finishing running jobs (grace %.1fs)", self.grace_period)
        self._stopping.set()
        self._wake.set()

    async def wait_active(self) -> None:
        """Return once this runner holds the active lock (for tests and tools)."""
        await self._active.wait()

    # -- the life of a worker -------------------------------------------------

    async def run(self) -> dict[str, Any]:
        url = db.database_url(self.database_url)
        restore = self._install_signals()
        try:
            self._control = await self._announce(url)
            if not await self._become_active():
                return self._finish("stopped", active=False)
            engine = db.create_engine(url, pool_size=self.concurrency, max_overflow=0)
            event.listen(engine.sync_engine, "handle_error", _mark_db_error)
            try:
                await self._work(engine)
            finally:
                await engine.dispose()
            return self._finish("stopped", active=True)
        finally:
            restore()
            await self._release()

    async def _announce(self, url: str) -> asyncpg.Connection:
        """Connect and take a liveness lock on a fresh random id."""
        for _ in range(10):
            self.worker_id = secrets.randbelow(2**31 - 2) + 1
            conn = await db.connect(url, application_name=self._app_name("standby"))
            locked = await queries["lock_worker"].fetchval(
                conn, lock_class=WORKER_LOCK_CLASS, worker_id=self.worker_id
            )
            if locked:
                logger.info("worker %d (%s) connected", self.worker_id, self.name)
                return conn
            await conn.close()
        raise RuntimeError("could not find a free worker id")  # 2**31 ids: never in practice

    async def _become_active(self) -> bool:
        """Wait for the active lock, or for a stop request. True once active."""
        assert self._control is not None
        self.state = "standby"
        if await queries["try_lock_active"].fetchval(
            self._control, lock_class=LOCK_CLASS, key=ACTIVE_KEY
        ):
            return await self._activated()
        logger.info("worker %d standing by: another worker is active", self.worker_id)
        waiting = asyncio.ensure_future(
            queries["lock_active"].fetch(self._control, lock_class=LOCK_CLASS, key=ACTIVE_KEY)
        )
        stopping = asyncio.ensure_future(self._stopping.wait())
        done, _ = await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if waiting in done:
            stopping.cancel()
            waiting.result()
            return await self._activated()
        # Stopped while standing by: drop the connection, and the wait with it.
        waiting.cancel()
        self._control.terminate()
        with contextlib.suppress(BaseException):
            await waiting
        return False

    async def _activated(self) -> bool:
        assert self._control is not None
        self.state = "active"
        await self._control.execute(
            "SELECT set_config('application_name', $1, false)", self._app_name("active")
        )
        await self._control.add_listener(CHANNEL, self._on_notify)
        logger.info("worker %d is active", self.worker_id)
        self.stats.start_clock()
        self._active.set()
        await self._rescue()
        return True

    async def _work(self, engine: AsyncEngine) -> None:
        lanes = [asyncio.create_task(self._lane(engine, n)) for n in range(self.concurrency)]
        upkeep = asyncio.create_task(self._upkeep())
        all_lanes: asyncio.Future[list[None]] = asyncio.gather(*lanes)
        try:
            await self._until(all_lanes, self._stopping)
            if not all_lanes.done():
                self.state = "stopping"
                await self._until(all_lanes, self._abandon, timeout=self.grace_period)
                if not all_lanes.done():
                    await self._abandon_lanes(lanes)
            if self._abandon.is_set():
                await asyncio.gather(*lanes, return_exceptions=True)
            else:
                await all_lanes  # re-raises a lane's unexpected error
        finally:
            upkeep.cancel()
            for task in lanes:
                task.cancel()
            await asyncio.gather(upkeep, *lanes, return_exceptions=True)
            if all_lanes.done() and not all_lanes.cancelled():
                all_lanes.exception()  # retrieved: errors of lanes cut off on purpose

    @staticmethod
    async def _until(
        work: asyncio.Future[Any], flag: asyncio.Event, timeout: float | None = None
    ) -> None:
        """Wait for `work` to finish or `flag` to be set, whichever comes first."""
        flagged = asyncio.ensure_future(flag.wait())
        try:
            await asyncio.wait({work, flagged}, timeout=timeout,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            flagged.cancel()

    async def _abandon_lanes(self, lanes: Sequence[asyncio.Task[None]]) -> None:
        """Grace is over: cut the lanes' connections so their transactions roll
        back (nothing half-done commits), then hand every job back."""
        self._abandon.set()
        logger.warning("abandoning %d running lane(s); their jobs go back to the queue",
                       sum(not t.done() for t in lanes))
        async with self._control_lock:
            assert self._control is not None
            for pid in list(self._lane_pids.values()):
                await self._control.execute("SELECT pg_terminate_backend($1)", pid)
        for task in lanes:
            task.cancel()
        await asyncio.gather(*lanes, return_exceptions=True)
        await self._hand_back(None)

    async def _upkeep(self) -> None:
        """Periodic chores of the active worker: rescue jobs of dead workers."""
        while True:
            await asyncio.sleep(self.rescue_interval)
            await self._rescue()

    async def _rescue(self) -> None:
        async with self._control_lock:
            assert self._control is not None
            row = await queries["rescue"].fetchrow(
                self._control, worker_lock_class=WORKER_LOCK_CLASS
            )
        if row and row["n"]:
            self.stats.rescued += row["n"]
            logger.warning("returned %d job(s) of dead workers to the queue", row["n"])

    async def _hand_back(self, ids: list[uuid.UUID] | None) -> int:
        async with self._control_lock:
            assert self._control is not None
            row = await queries["hand_back"].fetchrow(
                self._control, worker_id=self.worker_id, ids=ids
            )
        n = row["n"] if row else 0
        self.stats.handed_back += n
        if n:
            logger.info("handed back %d job(s) that did not run", n)
        return n

    def _finish(self, status: str, *, active: bool) -> dict[str, Any]:
        self.stats.stop_clock()
        self.state = "stopped"
        report = {"status": status, "worker_id": self.worker_id, "was_active": active,
                  **self.stats.report()}
        logger.info("worker %d stopped: %s", self.worker_id, json.dumps(report))
        return report

    async def _release(self) -> None:
        """Let go of the locks by closing the connection that holds them."""
        control, self._control = self._control, None
        if control is None or control.is_closed():
            return
        try:
            await queries["unlock_all"].fetch(control)
            await control.close(timeout=5)
        except (TimeoutError, *_CONNECTION_ERRORS):
            control.terminate()

    # -- lanes ----------------------------------------------------------------

    async def _lane(self, engine: AsyncEngine, number: int) -> None:
        async with engine.connect() as conn:
            raw = await conn.get_raw_connection()
            self._lane_pids[number] = raw.driver_connection.get_server_pid()  # type: ignore[union-attr]
            session = AsyncSession(
                bind=conn, join_transaction_mode="create_savepoint", expire_on_commit=False
            )
            try:
                while not self._stopping.is_set():
                    self._wake.clear()
                    jobs = await self._claim(conn)
                    if jobs:
                        await self._run_batch(conn, session, jobs)
                    elif not await self._wait_for_work(conn):
                        return
            finally:
                self._lane_pids.pop(number, None)
                await session.close()

    async def _claim(self, conn: AsyncConnection) -> list[ClaimedJob]:
        async with conn.begin():
            result = await conn.execute(
                queries["claim"].text, {"limit": self.batch_size, "worker_id": self.worker_id}
            )
            return [ClaimedJob(*row) for row in result]

    async def _wait_for_work(self, conn: AsyncConnection) -> bool:
        """Sleep until a job may be due. False when a burst run is done."""
        async with conn.begin():
            due_in = (await conn.execute(queries["next_due"].text)).scalar()
        if self.burst and (due_in is None or due_in > 0):
            return False
        timeout = self.poll_interval
        if due_in is not None and due_in > 0:
            timeout = min(timeout, float(due_in))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)
        return True

    async def _run_batch(
        self, conn: AsyncConnection, session: AsyncSession, jobs: list[ClaimedJob]
    ) -> None:
        """Run a batch in one transaction; one commit records every outcome."""
        ids = [job.id for job in jobs]
        try:
            async with conn.begin():
                outcomes = _Outcomes()
                for index, job in enumerate(jobs):
                    if self._stopping.is_set():
                        outcomes.not_started = ids[index:]
                        break
                    await self._run_one(conn, session, job, outcomes)
                latencies = await self._record(conn, outcomes)
        except LostOwnership:
            logger.warning("batch of %d rolled back: another worker took some of its jobs",
                           len(jobs))
            await self._hand_back(ids)
            return
        except Exception as exc:
            if self._abandon.is_set() or not _is_connection_error(exc):
                raise
            logger.error("lane connection lost mid-batch (%s); batch rolled back", exc)
            await self._hand_back(ids)
            raise
        self._count(outcomes, latencies)

    async def _run_one(
        self, conn: AsyncConnection, session: AsyncSession, job: ClaimedJob, out: _Outcomes
    ) -> None:
        handler = self.registry.get(job.job_type)
        if handler is None:
            out.failed_ids.append(job.id)
            out.errors.append(f"no handler registered for job type {job.job_type!r}")
            out.delays.append(0.0)
            out.retry.append(False)
            return
        started = time.perf_counter()
        token = _current_job.set(job)
        conn.info.pop(_DB_ERROR, None)
        try:
            result = await handler(session, json.loads(job.payload))
            if conn.info.pop(_DB_ERROR, False):
                raise SwallowedDatabaseError(
                    "the handler caught a database error and went on; its writes are void")
            encoded = _encode_result(result)
            if session.in_transaction():
                await session.commit()  # releases the handler's savepoint
        except Exception as exc:
            if session.in_transaction():
                await session.rollback()  # back to the savepoint: the job's writes vanish
            retry = job.retry_count < job.max_retries
            out.failed_ids.append(job.id)
            out.errors.append(_error_text(exc))
            out.delays.append(self.retry_policy.delay(job.retry_count + 1) if retry else 0.0)
            out.retry.append(retry)
            logger.warning("job %s (%s) attempt %d failed%s: %s", job.id, job.job_type,
                           job.retry_count + 1, ", will retry" if retry else "",
                           _error_text(exc))
        else:
            out.done_ids.append(job.id)
            out.results.append(encoded)
            out.handler_times.append(time.perf_counter() - started)
        finally:
            _current_job.reset(token)
            session.expunge_all()

    async def _record(self, conn: AsyncConnection, out: _Outcomes) -> list[float]:
        latencies: list[float] = []
        if out.done_ids:
            result = await conn.execute(
                queries["complete"].text,
                {"ids": out.done_ids, "results": out.results, "worker_id": self.worker_id},
            )
            latencies = [float(v) for v in result.scalars()]
            if len(latencies) != len(out.done_ids):
                raise LostOwnership
        if out.failed_ids:
            result = await conn.execute(
                queries["fail"].text,
                {"ids": out.failed_ids, "errors": out.errors, "delays": out.delays,
                 "retry": out.retry, "worker_id": self.worker_id},
            )
            if len(result.all()) != len(out.failed_ids):
                raise LostOwnership
        if out.not_started:
            await conn.execute(
                queries["hand_back"].text, {"ids": out.not_started, "worker_id": self.worker_id}
            )
        return latencies

    def _count(self, out: _Outcomes, latencies: list[float]) -> None:
        stats = self.stats
        stats.batches += 1
        stats.completed += len(out.done_ids)
        retried = sum(out.retry)
        stats.retried += retried
        stats.failed += len(out.failed_ids) - retried
        stats.handed_back += len(out.not_started)
        for seconds in out.handler_times:
            stats.handler_time.add(seconds)
        for seconds in latencies:
            stats.latency.add(seconds)

    # -- small things ---------------------------------------------------------

    def _on_notify(self, *_: object) -> None:
        self._wake.set()

    def _app_name(self, role: str) -> str:
        return f"jobqueue worker {self.worker_id} {role} {self.name}"[:63]

    def _install_signals(self) -> Any:
        if not self.install_signal_handlers:
            return lambda: None
        loop = asyncio.get_running_loop()
        installed = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self.stop)
                installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                pass  # not the main thread, or not a Unix loop

        def restore() -> None:
            for sig in installed:
                loop.remove_signal_handler(sig)

        return restore
