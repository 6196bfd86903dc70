"""A lane: one connection that takes a batch of jobs, runs it, commits it, and again.

A batch is one transaction and one commit, whatever its size; each handler's
session opens a savepoint on its first statement only, so a handler that
never touches the database costs no round trip. One `complete` and one
`fail` statement record every outcome.

Two ways to take a batch, chosen per batch from how long the lane's recent
jobs took (`Lane.plan`):

- **quick** (jobs faster than `quick_batch`, 50 ms by default): lock as many
  due jobs as should finish within `quick_batch` (up to `batch_size`) inside
  the batch's own transaction (`take`), run them, record them, commit. One new
  row version per job; a crash rolls everything back and the jobs are simply
  waiting again. Their status goes from `pending` straight to `completed`:
  nobody could have watched a `processing` that lasts milliseconds.
- **claimed** (slower jobs, one per batch, and a lane's very first job): commit
  the claim first (`claim`), so the job shows `processing` with this worker's
  id while it runs; the outcome checks that the worker still owns it (if
  another worker took it meanwhile, this one was declared hung: nothing
  commits).

The lane runs its transactions on the asyncpg connection itself; SQLAlchemy
sees the connection in autocommit mode, so it never sends a BEGIN or COMMIT of
its own and a handler's session only ever adds savepoints to the lane's batch.
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
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from jobqueue.enqueue import check_strings
from jobqueue.errors import is_connection_error, one_line
from jobqueue.models import ERROR_MESSAGE_MAX_LENGTH
from jobqueue.queries import queries

if TYPE_CHECKING:
    from jobqueue.worker import JobRunner

logger = logging.getLogger("jobqueue.worker")


class ClaimedJob(NamedTuple):
    """A job as a lane runs it (a tuple: built straight from the claimed row)."""

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

    def success(self, job_id: uuid.UUID, result: str | None, seconds: float) -> None:
        self.done_ids.append(job_id)
        self.results.append(result)
        self.handler_times.append(seconds)

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


#: Weight of the newest batch in a lane's running estimate of a job's run time.
_PACE_WEIGHT = 0.3


class Lane:
    """One of a worker's `concurrency` lanes."""

    def __init__(self, runner: JobRunner, engine: AsyncEngine, number: int) -> None:
        self.runner = runner
        self.engine = engine
        self.number = number
        self.raw: Any = None  # the asyncpg connection, to cut it off when abandoning
        #: Recent seconds a job takes to run (its handler and savepoint; the
        #: batch's own statements are left out, or a lone job's commit would
        #: count as if each job of a full batch paid it); None until a batch ran.
        self.per_job: float | None = None

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

    def plan(self) -> tuple[bool, int]:
        """How to take the next batch: (quick?, how many jobs at most).

        Jobs that run faster than `quick_batch` go in quick batches sized to
        last about that long (at most `batch_size`); slower ones are claimed
        one at a time, so `processing` means running and no transaction stays
        open across many slow jobs. A lane that has not run anything yet
        claims one job to learn the pace. `quick_batch` 0: claimed batches of
        up to `batch_size`, never quick."""
        runner = self.runner
        if runner.quick_batch == 0:
            return False, runner.batch_size
        if self.per_job is None or self.per_job > runner.quick_batch:
            return False, 1
        fits = int(runner.quick_batch / self.per_job) if self.per_job > 0 else runner.batch_size
        return True, max(1, min(runner.batch_size, fits))

    async def _loop(self, conn: AsyncConnection) -> None:
        runner = self.runner
        session = AsyncSession(bind=conn, join_transaction_mode="create_savepoint",
                               expire_on_commit=False)
        event.listen(session.sync_session, "before_commit", _refuse_handler_commit)
        try:
            while not runner.stopping:
                runner.wake.clear()
                if not await self._next_batch(conn, session) \
                        and not await self._wait_for_work():
                    return
        finally:
            with contextlib.suppress(Exception):
                await session.close()

    async def _next_batch(self, conn: AsyncConnection, session: AsyncSession) -> bool:
        """Take and run one batch; False when nothing was due."""
        raw, runner = self.raw, self.runner
        held, limit = self.plan()
        if held:
            taken = await self._lock("take", limit=limit)
            if taken is None:
                return False
            tx, rows = taken
        else:
            rows = await queries["claim"].fetch(raw, limit=limit, worker_id=runner.worker_id)
            if not rows:
                return False
            tx = raw.transaction()
            await tx.start()
        await self._run_batch(conn, session, tx, list(map(ClaimedJob._make, rows)), held)
        return True

    async def _lock(self, query: str, **values: Any) -> tuple[Any, list[Any]] | None:
        """Begin a transaction and lock jobs in it with `query` (take, retake);
        None, the transaction rolled back, when there were none."""
        tx = self.raw.transaction()
        await tx.start()
        try:
            rows = await queries[query].fetch(self.raw, **values)
        except BaseException:
            await _rollback(tx)
            raise
        if not rows:
            await tx.rollback()
            return None
        return tx, rows

    def _pace(self, seconds: float, jobs: int) -> None:
        """Fold a batch's run time into the lane's estimate of a job's."""
        per_job = seconds / jobs
        self.per_job = per_job if self.per_job is None else (
            _PACE_WEIGHT * per_job + (1 - _PACE_WEIGHT) * self.per_job)

    async def _wait_for_work(self) -> bool:
        """Sleep until a job may be due. False when a burst run is done."""
        due_in = await queries["next_due"].fetchval(self.raw)
        if self.runner.burst and (due_in is None or due_in > 0):
            return False
        timeout = self.runner.poll_interval
        if due_in is not None and due_in > 0:
            timeout = min(timeout, float(due_in))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.runner.wake.wait(), timeout)
        return True

    async def _run_batch(self, conn: AsyncConnection, session: AsyncSession, tx: Any,
                         jobs: list[ClaimedJob], held: bool) -> None:
        """Run a batch in the open transaction `tx`; one commit records every outcome.
        `held`: the jobs were taken by this transaction, not claimed before it."""
        runner = self.runner
        outcomes = Outcomes()
        try:
            async with conn.begin():  # no SQL: tells handler sessions to use savepoints
                info, session_info = conn.info, session.info
                started, ran = time.perf_counter(), 0
                for job in jobs:
                    # A quick batch that outruns quick_batch (slow jobs after fast
                    # ones) stops early: its untouched jobs are released at the
                    # commit, and the lane's pace now says to claim them.
                    if runner.stopping or (held and ran and time.perf_counter() - started
                                           > runner.quick_batch):
                        outcomes.not_started = [job.id for job in jobs[ran:]]
                        break
                    await self._run_one(conn, session, job, outcomes, info, session_info)
                    ran += 1
                if ran:
                    self._pace(time.perf_counter() - started, ran)
            latencies = await self._record(outcomes, held)
            await tx.commit()
        except LostOwnership:
            await _rollback(tx)
            logger.warning("batch of %d rolled back: another worker took some of its jobs",
                           len(jobs), extra={"event": "batch_lost", "jobs": len(jobs),
                                             "worker_id": runner.worker_id})
            if not held:
                await runner.hand_back([job.id for job in jobs])
            return
        except Exception as exc:
            await _rollback(tx)
            if runner.aborting:
                raise
            if not is_connection_error(exc):
                await self._after_batch_error(conn, session, jobs, held, exc)
                return
            logger.error("lane %d: connection lost mid-batch; %d job(s) go back to the queue",
                         self.number, len(jobs),
                         extra={"event": "batch_connection_lost", "lane": self.number,
                                "jobs": len(jobs), "worker_id": runner.worker_id,
                                "error": one_line(exc)})
            if not held:
                await runner.hand_back([job.id for job in jobs])
            raise
        runner.stats.count_batch(outcomes, latencies)
        if outcomes.done_ids and logger.isEnabledFor(logging.INFO):
            self._log_completed(jobs, outcomes)  # committed: now they are done

    async def _after_batch_error(self, conn: AsyncConnection, session: AsyncSession,
                                 jobs: list[ClaimedJob], held: bool, exc: Exception) -> None:
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
                again = await self._begin_for(job, held)
                if again is not None:
                    await self._run_batch(conn, session, again[0], [again[1]], held)
            return
        again = await self._begin_for(jobs[0], held)
        if again is None:
            return
        tx, job = again
        out = Outcomes()
        retry = job.retry_count < job.max_retries
        delay = self.runner.retry_policy.delay(job.attempt) if retry else 0.0
        out.failure(job.id, error_text(exc), retry=retry, delay=delay)
        try:
            await self._record(out, held)
            await tx.commit()
        except BaseException:
            await _rollback(tx)
            raise
        self.runner.stats.count_batch(out, [])
        logger.warning("job %s (%s) attempt %d failed at commit: %s", job.id, job.job_type,
                       job.attempt, error_text(exc),
                       extra={"event": "job_failed", "job_id": str(job.id),
                              "job_type": job.job_type, "attempt": job.attempt,
                              "worker_id": self.runner.worker_id, "retry": retry,
                              "error": error_text(exc)})

    async def _begin_for(self, job: ClaimedJob, held: bool) -> tuple[Any, ClaimedJob] | None:
        """A transaction for one job of a rolled-back batch, and the job as it
        stands. A claimed job is still this worker's; a taken one was released
        by the rollback and is locked again, as it is now (another worker may
        have tried it meanwhile), unless another worker has it (then None)."""
        if not held:
            tx = self.raw.transaction()
            await tx.start()
            return tx, job
        retaken = await self._lock("retake", ids=[job.id])
        if retaken is None:
            return None
        tx, [row] = retaken
        return tx, ClaimedJob._make(row)

    async def _run_one(self, conn: AsyncConnection, session: AsyncSession, job: ClaimedJob,
                       out: Outcomes, info: dict[Any, Any], session_info: dict[Any, Any]
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
        info.pop(DB_ERROR, None)
        try:
            session_info[IN_HANDLER] = True
            try:
                result = await handler(session, json.loads(job.payload))
            finally:
                session_info[IN_HANDLER] = False
            if info.pop(DB_ERROR, False):
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
            out.success(job.id, encoded, time.perf_counter() - started)
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

    async def _record(self, out: Outcomes, held: bool) -> list[float]:
        """Write a batch's outcomes in its transaction; the successes' latencies."""
        raw, worker_id = self.raw, self.runner.worker_id
        latencies: list[float] = []
        if out.done_ids:
            rows = await queries["complete"].fetch(
                raw, ids=out.done_ids, results=out.results, worker_id=worker_id, held=held)
            if len(rows) != len(out.done_ids):
                raise LostOwnership
            latencies = [row[0] for row in rows]
        if out.failed_ids:
            rows = await queries["fail"].fetch(
                raw, ids=out.failed_ids, errors=out.errors, delays=out.delays,
                retry=out.retry, worker_id=worker_id, held=held)
            if len(rows) != len(out.failed_ids):
                raise LostOwnership
        if out.not_started and not held:  # taken jobs are released by the commit
            await queries["hand_back"].fetch(raw, ids=out.not_started, worker_id=worker_id)
        return latencies


async def _rollback(tx: Any) -> None:
    """Roll back if still open; on a dead connection there is nothing to undo."""
    with contextlib.suppress(Exception):
        await tx.rollback()
