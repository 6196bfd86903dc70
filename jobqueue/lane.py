"""A lane: one connection that claims a batch, runs it, commits it, and again.

A batch is one transaction. The claim before it is committed on its own, so
the jobs show as `processing` (and carry the worker's id) while they run. Each
handler's session opens a savepoint on its first statement only, so a handler
that never touches the database costs no round trip. One `complete` and one
`fail` statement record every outcome, with ownership checked: if another
worker took a job meanwhile (this one was declared hung), nothing commits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from jobqueue.enqueue import check_strings
from jobqueue.errors import is_connection_error, one_line
from jobqueue.models import ERROR_MESSAGE_MAX_LENGTH
from jobqueue.queries import queries

if TYPE_CHECKING:
    from jobqueue.worker import JobRunner

logger = logging.getLogger("jobqueue.worker")


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
DB_ERROR = "jobqueue_db_error"
#: Key in a lane session's `info` dict: a handler is running.
IN_HANDLER = "jobqueue_in_handler"


class HandlerCommitError(RuntimeError):
    """A handler called commit() on its session. Its writes must commit with
    the job's completion, or a failure after the commit would leave them
    committed and the retry would write them again."""


def _refuse_handler_commit(session: Any) -> None:
    """SQLAlchemy `before_commit` hook on a lane's session."""
    if session.info.get(IN_HANDLER):
        raise HandlerCommitError(
            "handlers must not commit: their writes commit with the job's completion")


def mark_db_error(context: Any) -> None:
    """SQLAlchemy `handle_error` hook: remember which connection saw an error."""
    if context.connection is not None:
        context.connection.info[DB_ERROR] = True


@dataclass
class Outcomes:
    """What happened to the jobs of one batch, in the shape the SQL wants."""

    done_ids: list[uuid.UUID] = field(default_factory=list)
    results: list[str | None] = field(default_factory=list)
    handler_times: list[float] = field(default_factory=list)
    failed_ids: list[uuid.UUID] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    delays: list[float] = field(default_factory=list)
    retry: list[bool] = field(default_factory=list)
    not_started: list[uuid.UUID] = field(default_factory=list)

    def failure(self, job_id: uuid.UUID, error: str, retry: bool, delay: float) -> None:
        self.failed_ids.append(job_id)
        self.errors.append(error[:ERROR_MESSAGE_MAX_LENGTH])
        self.retry.append(retry)
        self.delays.append(delay)


def error_text(exc: BaseException) -> str:
    """The error as text PostgreSQL can store (no NUL, no lone surrogate)."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    text = text.replace("\x00", "\\0").encode("utf-8", "backslashreplace").decode("utf-8")
    return text[:ERROR_MESSAGE_MAX_LENGTH]


def encode_result(result: Any) -> str | None:
    if result is None:
        return None
    try:
        check_strings(result, "result")
        encoded = json.dumps(result, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        encoded.encode("utf-8")
    except (TypeError, ValueError) as e:  # UnicodeEncodeError is a ValueError
        raise TypeError(f"handler result is not JSON PostgreSQL can store: {e}") from None
    return encoded


class Lane:
    """One of a worker's `concurrency` lanes."""

    def __init__(self, runner: JobRunner, engine: AsyncEngine, number: int) -> None:
        self.runner = runner
        self.engine = engine
        self.number = number
        self.raw: Any = None  # the asyncpg connection, to cut it off when abandoning

    async def run(self) -> None:
        """Work until the worker stops. A lost connection is not reopened here:
        a claim whose reply was lost leaves jobs this lane cannot name, so the
        error ends the worker's life; it starts over under a new id, and the old
        id's jobs are rescued like a dead worker's."""
        try:
            async with self.engine.connect() as conn:
                self.raw = (await conn.get_raw_connection()).driver_connection
                await self._loop(conn)
        finally:
            self.raw = None

    def _connection_lost(self, conn: AsyncConnection) -> bool:
        """Did this lane's own connection fail? A handler's `ConnectionError`
        or `TimeoutError` from some other service (SMTP, HTTP) is the job's
        failure, not a reason to send the whole batch back."""
        return conn.invalidated or self.raw is None or self.raw.is_closed()

    def cut(self) -> None:
        """Close the connection at once (abandoning: its transaction rolls back)."""
        if self.raw is not None and not self.raw.is_closed():
            self.raw.terminate()

    async def _loop(self, conn: AsyncConnection) -> None:
        runner = self.runner
        session = AsyncSession(bind=conn, join_transaction_mode="create_savepoint",
                               expire_on_commit=False)
        event.listen(session.sync_session, "before_commit", _refuse_handler_commit)
        try:
            while not runner.stopping:
                runner.wake.clear()
                jobs = await self._claim(conn)
                if jobs:
                    await self._run_batch(conn, session, jobs)
                elif not await self._wait_for_work(conn):
                    return
        finally:
            with contextlib.suppress(Exception):
                await session.close()

    async def _claim(self, conn: AsyncConnection) -> list[ClaimedJob]:
        async with conn.begin():
            result = await conn.execute(
                queries["claim"].text,
                {"limit": self.runner.batch_size, "worker_id": self.runner.worker_id},
            )
            return [ClaimedJob(*row) for row in result]

    async def _wait_for_work(self, conn: AsyncConnection) -> bool:
        """Sleep until a job may be due. False when a burst run is done."""
        async with conn.begin():
            due_in = (await conn.execute(queries["next_due"].text)).scalar()
        if self.runner.burst and (due_in is None or due_in > 0):
            return False
        timeout = self.runner.poll_interval
        if due_in is not None and due_in > 0:
            timeout = min(timeout, float(due_in))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.runner.wake.wait(), timeout)
        return True

    async def _run_batch(
        self, conn: AsyncConnection, session: AsyncSession, jobs: list[ClaimedJob]
    ) -> None:
        """Run a batch in one transaction; one commit records every outcome."""
        ids = [job.id for job in jobs]
        try:
            async with conn.begin():
                outcomes = Outcomes()
                for index, job in enumerate(jobs):
                    if self.runner.stopping:
                        outcomes.not_started = ids[index:]
                        break
                    await self._run_one(conn, session, job, outcomes)
                latencies = await self._record(conn, outcomes)
        except LostOwnership:
            logger.warning("batch of %d rolled back: another worker took some of its jobs",
                           len(jobs), extra={"event": "batch_lost", "jobs": len(jobs),
                                             "worker_id": self.runner.worker_id})
            await self.runner.hand_back(ids)
            return
        except Exception as exc:
            if self.runner.aborting:
                raise
            if not is_connection_error(exc):
                await self._after_batch_error(conn, session, jobs, exc)
                return
            logger.error("lane %d: connection lost mid-batch; %d job(s) go back to the queue",
                         self.number, len(jobs),
                         extra={"event": "batch_connection_lost", "lane": self.number,
                                "jobs": len(jobs), "worker_id": self.runner.worker_id,
                                "error": one_line(exc)})
            await self.runner.hand_back(ids)
            raise
        self.runner.stats.count_batch(outcomes, latencies)
        if outcomes.done_ids and logger.isEnabledFor(logging.INFO):
            self._log_completed(jobs, outcomes)  # committed: now they are done

    async def _after_batch_error(self, conn: AsyncConnection, session: AsyncSession,
                                 jobs: list[ClaimedJob], exc: Exception) -> None:
        """The batch could not be recorded or committed (a deferred constraint
        a handler broke, say): it rolled back whole. Run its jobs again one per
        transaction, so the culprit fails alone; a lone job that still cannot
        commit is failed without its writes, its attempt counted."""
        if len(jobs) > 1:
            logger.warning("batch of %d could not commit (%s); running its jobs one by one",
                           len(jobs), one_line(exc),
                           extra={"event": "batch_split", "jobs": len(jobs),
                                  "worker_id": self.runner.worker_id, "error": one_line(exc)})
            for job in jobs:
                await self._run_batch(conn, session, [job])
            return
        [job] = jobs
        out = Outcomes()
        retry = job.retry_count < job.max_retries
        delay = self.runner.retry_policy.delay(job.attempt) if retry else 0.0
        out.failure(job.id, error_text(exc), retry=retry, delay=delay)
        async with conn.begin():
            await self._record(conn, out)
        self.runner.stats.count_batch(out, [])
        logger.warning("job %s (%s) attempt %d failed at commit: %s", job.id, job.job_type,
                       job.attempt, error_text(exc),
                       extra={"event": "job_failed", "job_id": str(job.id),
                              "job_type": job.job_type, "attempt": job.attempt,
                              "worker_id": self.runner.worker_id, "retry": retry,
                              "error": error_text(exc)})

    async def _run_one(
        self, conn: AsyncConnection, session: AsyncSession, job: ClaimedJob, out: Outcomes
    ) -> None:
        runner = self.runner
        handler = runner.registry.get(job.job_type)
        if handler is None:
            out.failure(job.id, f"no handler registered for job type {job.job_type!r}",
                        retry=False, delay=0.0)
            logger.warning("job %s (%s) attempt %d failed: no handler registered", job.id,
                           job.job_type, job.attempt,
                           extra={"event": "job_failed", "job_id": str(job.id),
                                  "job_type": job.job_type, "attempt": job.attempt,
                                  "worker_id": runner.worker_id, "retry": False,
                                  "error": "no handler registered"})
            return
        started = time.perf_counter()
        token = _current_job.set(job)
        conn.info.pop(DB_ERROR, None)
        try:
            session.info[IN_HANDLER] = True
            try:
                result = await handler(session, json.loads(job.payload))
            finally:
                session.info[IN_HANDLER] = False
            if conn.info.pop(DB_ERROR, False):
                raise SwallowedDatabaseError(
                    "the handler caught a database error and went on; its writes are void")
            encoded = encode_result(result)
            if session.in_transaction():
                await session.commit()  # releases the handler's savepoint
        except Exception as exc:
            if session.in_transaction():
                await session.rollback()  # back to the savepoint: the job's writes vanish
            if is_connection_error(exc) and self._connection_lost(conn):
                raise  # not the job's fault: the whole batch goes back
            retry = job.retry_count < job.max_retries
            delay = runner.retry_policy.delay(job.attempt) if retry else 0.0
            out.failure(job.id, error_text(exc), retry=retry, delay=delay)
            logger.warning("job %s (%s) attempt %d failed%s: %s", job.id, job.job_type,
                           job.attempt, f", retry in {delay:.2f}s" if retry else "",
                           error_text(exc),
                           extra={"event": "job_failed", "job_id": str(job.id),
                                  "job_type": job.job_type, "attempt": job.attempt,
                                  "duration_ms": round((time.perf_counter() - started) * 1000,
                                                       3),
                                  "worker_id": runner.worker_id, "retry": retry,
                                  "retry_in_s": round(delay, 3) if retry else None,
                                  "error": error_text(exc)})
        else:
            out.done_ids.append(job.id)
            out.results.append(encoded)
            out.handler_times.append(time.perf_counter() - started)
        finally:
            _current_job.reset(token)
            if session.identity_map:
                session.expunge_all()

    def _log_completed(self, jobs: list[ClaimedJob], out: Outcomes) -> None:
        """One INFO event per completed job of a committed batch."""
        by_id = {job.id: job for job in jobs}
        worker_id = self.runner.worker_id
        for job_id, seconds in zip(out.done_ids, out.handler_times, strict=True):
            job = by_id[job_id]
            ms = round(seconds * 1000, 3)
            logger.info("job %s (%s) attempt %d completed in %.1f ms", job.id, job.job_type,
                        job.attempt, ms,
                        extra={"event": "job_completed", "job_id": str(job.id),
                               "job_type": job.job_type, "attempt": job.attempt,
                               "duration_ms": ms, "worker_id": worker_id})

    async def _record(self, conn: AsyncConnection, out: Outcomes) -> list[float]:
        worker_id = self.runner.worker_id
        latencies: list[float] = []
        if out.done_ids:
            result = await conn.execute(
                queries["complete"].text,
                {"ids": out.done_ids, "results": out.results, "worker_id": worker_id},
            )
            latencies = [float(v) for v in result.scalars()]
            if len(latencies) != len(out.done_ids):
                raise LostOwnership
        if out.failed_ids:
            result = await conn.execute(
                queries["fail"].text,
                {"ids": out.failed_ids, "errors": out.errors, "delays": out.delays,
                 "retry": out.retry, "worker_id": worker_id},
            )
            if len(result.all()) != len(out.failed_ids):
                raise LostOwnership
        if out.not_started:
            await conn.execute(
                queries["hand_back"].text, {"ids": out.not_started, "worker_id": worker_id}
            )
        return latencies
