"""Sync handlers: plain `def` handlers, run in threads, off the event loop.

Most code people move onto a queue blocks (requests, boto3, an ORM without
async). Run on the event loop, a blocking call would stall every lane and,
past the lease, the heartbeat too (`upkeep.py`): the worker would be fenced.
So a sync handler runs in a thread of a bounded pool (`pool.ThreadPool`, `threads`
of them), with a sync `Session` on a psycopg 3 connection of its own, in a
transaction that also records the job's outcome:

1. **Claimed first.** A lane of its own (a `Lane` given a `ThreadExecutor`,
   serving only the sync job types) claims as many due sync jobs as threads are free,
   with the same `claim` (or `claim_limited`) statement and turn among the
   queues as every lane, and commits the claim: the jobs show `processing`
   with this worker's id. They are never taken in a quick batch: a job locked
   by a lane's batch transaction could not be completed from another
   connection (it would wait for the row lock), and the other lanes never
   see sync types at all (the runner gives them the async types only).
2. **Run and recorded in one transaction, in the thread.** The handler's
   session joins a transaction on the thread's connection; when it returns,
   `complete` runs in that same transaction and one commit makes its writes
   and the job's completion durable together. When it raises, the
   transaction rolls back (its writes are gone) and `fail` records the
   attempt in a new one, with the worker's retry policy. The lane records
   nothing for these jobs: the thread did.

A sync job costs two commits (the claim and the outcome), where a job of a
quick batch shares one commit with its batch-mates; see the throughput
notebook for what that means in jobs per second.

**Stopping.** SIGTERM: no new claims; running sync handlers get the grace
period to finish and record their outcome. Abandoned (a second signal, the
grace period over, a lost connection, a fencing): each running job's
connection is cut under it (its socket shut down, `pool.sever`; its backend
terminated by the runner's `terminate_lanes`), so its transaction rolls
back, and nothing the thread does after that is recorded; the job goes back
to the queue (`hand_back`, or a rescue), no attempt counted. A thread cannot
be killed: what an interrupt can and cannot stop is in `pool.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, cast

import sqlalchemy
from sqlalchemy import Connection, Engine, event
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.orm import Session

from jobqueue import db, tracing
from jobqueue.errors import is_connection_error, one_line
from jobqueue.registry import SyncJobHandler
from jobqueue.schema.locks import CANCELLED
from jobqueue.schema.queries import queries
from jobqueue.worker.batch import (
    Alone,
    BatchKind,
    Claim,
    Claimed,
    Kinds,
    Limited,
    Started,
    split,
)
from jobqueue.worker.completer import LostOwnership, tid_array
from jobqueue.worker.config import WorkerConfig
from jobqueue.worker.floors import Arms
from jobqueue.worker.guard import refusal
from jobqueue.worker.handler import (
    COMMIT_REFUSED,
    IN_HANDLER,
    NESTED_LEFT_OPEN,
    ClaimedJob,
    HandlerCommitError,
    HandlerError,
    _current_job,
    refuse_handler_commit,
    result_of,
)
from jobqueue.worker.interrupt import timed_out
from jobqueue.worker.life import Life
from jobqueue.worker.outcome import (
    Decided,
    Outcomes,
    log_completed,
    note,
    outcome_of,
    timeout_of,
)
from jobqueue.worker.pacing import Plan
from jobqueue.worker.pool import Interrupted, SyncRun, ThreadPool, sever

logger = logging.getLogger("jobqueue.worker")

#: Key in a thread connection's `info`: the `SyncRun` it is running.
RUN = "jobqueue_sync_run"


class HandlerSession(Session):
    """The session a sync handler gets: its commit is refused, as an async
    handler's is (its writes commit with the job's completion)."""


event.listen(HandlerSession, "before_commit", refuse_handler_commit)


def thread_engine(url: str, threads: int, application_name: str) -> Engine:
    """The engine the threads draw their connections from: psycopg 3, one
    connection per thread (opened when first needed), named like the
    lanes' connections so that `terminate_lanes` and fencing reach them.

    In autocommit mode, as the lanes' are: SQLAlchemy sends no BEGIN of its
    own, and the job's transaction begins just before the handler's first
    statement (`_before_statement`). A handler that never touches the
    database (an HTTP call, an S3 upload) costs one round trip to record:
    `complete` alone, which commits as it runs; a handler that writes pays
    BEGIN and COMMIT around its statements and the `complete` after them.
    Its errors and its log never show a statement's values (`hide_parameters`,
    `redact.py` says why)."""
    # looked up when called, as `db.create_engine` says why
    engine = sqlalchemy.create_engine(db.sync_url(url), pool_size=threads, max_overflow=0,
                                      pool_pre_ping=False, isolation_level="AUTOCOMMIT",
                                      hide_parameters=True,
                                      connect_args={"application_name": application_name})
    event.listen(engine, "before_cursor_execute", _before_statement)
    event.listen(engine, "after_cursor_execute", _after_statement)
    event.listen(engine, "rollback", _rolled_back)
    event.listen(engine, "commit", _refuse_commit)
    event.listen(engine, "handle_error", _note_error)
    event.listen(engine, "rollback_savepoint", _recovered)
    return engine


def _run_of(conn: Any) -> SyncRun | None:
    run = conn.info.get(RUN)
    return run if run is not None and run.in_handler else None


def _before_statement(conn: Any, cursor: Any, statement: str, parameters: Any,
                      context: Any, executemany: bool) -> None:
    """A handler's statement: interrupted, or into the job's transaction
    (begun here, on the driver, before its first one)."""
    run = _run_of(conn)
    if run is None:
        return
    # Marked before the reason is read, as `interrupt` sets the reason before
    # it reads the mark: either this statement is refused here, or it is
    # cancelled on the server.
    run.in_statement = True
    if run.reason is not None:
        run.in_statement = False
        raise Interrupted(run.reason)
    if (reason := refusal(statement)) is not None:
        run.in_statement = False
        run.refused = reason
        raise HandlerCommitError(reason)
    if not run.began:
        run.driver.execute("BEGIN")
        run.began = True


def _after_statement(conn: Any, cursor: Any, statement: str, parameters: Any,
                     context: Any, executemany: bool) -> None:
    if (run := _run_of(conn)) is not None:
        run.in_statement = False


def _rolled_back(conn: Any) -> None:
    """The handler's session rolled back: its transaction is gone (the driver
    sends the ROLLBACK), and its next statement begins a new one."""
    if (run := _run_of(conn)) is not None:
        run.began = False


def _refuse_commit(conn: Any) -> None:
    """The handler committed its connection itself (`session.connection()
    .commit()`): refused before it reaches the server, or writes committed
    before a later failure would be written again by the retry."""
    if (run := _run_of(conn)) is not None:
        run.refused = COMMIT_REFUSED
        raise HandlerCommitError(COMMIT_REFUSED)


def _note_error(context: Any) -> None:
    if context.connection is not None and (run := _run_of(context.connection)) is not None:
        run.db_error = True
        run.in_statement = False


def _recovered(conn: Any, name: str, context: Any) -> None:
    """Rolled back to a savepoint of its own: the error inside it is undone."""
    if (run := _run_of(conn)) is not None:
        run.db_error = False


def _roll_back(conn: Connection, run: SyncRun) -> None:
    """Undo the job's transaction, if one is open (on the driver, which SQLAlchemy
    in autocommit mode leaves alone), and SQLAlchemy's own bookkeeping."""
    run.began = False
    with contextlib.suppress(Exception):
        run.driver.rollback()
    with contextlib.suppress(Exception):
        conn.rollback()


def _record(conn: Connection, run: SyncRun, out: Outcomes, worker_id: int) -> list[float]:
    """Write one job's outcome and make it durable: in the job's transaction
    after the handler's writes, then COMMIT, so that both commit together;
    alone (it commits as it runs) when the handler wrote nothing.
    LostOwnership when the job is no longer this worker's (it was declared
    hung and another worker took it): nothing commits."""
    rows: Sequence[Any] = ()
    if out.done_ids:
        if run.job.tid is not None:  # where its claim wrote it (`complete_claimed`)
            rows = conn.execute(queries["complete_claimed"].text, {
                "ids": out.done_ids, "results": out.results, "worker_id": worker_id,
                "tids": tid_array([run.job.tid])}).all()
        if not rows:  # no address, or its row moved since (the handler updated its job)
            rows = conn.execute(queries["complete"].text, {
                "ids": out.done_ids, "results": out.results, "worker_id": worker_id,
                "taken": False}).all()
    elif out.snoozed_ids:
        rows = conn.execute(queries["snooze"].text, {
            "ids": out.snoozed_ids, "delays": out.snoozes, "worker_id": worker_id,
            "taken": False}).all()
    else:
        rows = conn.execute(queries["fail"].text, {
            "ids": out.failed_ids, "errors": out.errors, "delays": out.delays,
            "retry": out.retry, "traces": out.traces, "worker_id": worker_id,
            "taken": False}).all()
    if len(rows) != 1:
        raise LostOwnership
    if run.began:
        run.driver.commit()
        run.began = False
    conn.rollback()  # SQLAlchemy's transaction, which sent nothing
    return [float(row.latency) for row in rows] if out.done_ids else []


class _ClaimOnly(Claimed):
    """Claimed, and no batch transaction after the claim: each job runs in a
    transaction of its own, in its thread."""

    async def start(self, raw: Any, limit: int, worker_id: int, queue: str,
                    job_types: list[str], arms: Arms) -> Claim:
        rows, places = split(await self.claimed(raw, limit, worker_id, queue, job_types, arms))
        return Claim(Started(None, list(map(ClaimedJob._make, rows))) if rows else None, places)


class _LimitedClaimOnly(_ClaimOnly, Limited):
    """`_ClaimOnly` for a paused or limited queue (`Limited`'s admission)."""


class _AloneClaimOnly(_ClaimOnly, Alone):
    """`_ClaimOnly` for a job that must run alone (`Alone`'s admission)."""


CLAIM_ONLY, LIMITED_CLAIM_ONLY, ALONE_CLAIM_ONLY = (
    _ClaimOnly(), _LimitedClaimOnly(), _AloneClaimOnly())


class ThreadExecutor:
    """The executor of the sync job types' lane: it wants as many due jobs as
    threads are free (never a quick batch), hands each to a thread of `pool`,
    and lets the lane go on claiming while they run. The lane's connection
    only claims; each thread records its job's outcome on a connection of
    its own (`sync_engine`)."""

    kinds = Kinds(CLAIM_ONLY, CLAIM_ONLY, LIMITED_CLAIM_ONLY, ALONE_CLAIM_ONLY)

    def __init__(self, config: WorkerConfig, life: Life, pool: ThreadPool,
                 sync_engine: Engine) -> None:
        self.config = config
        self.life = life
        self.worker_id = life.worker_id
        self.pool = pool
        self.sync_engine = sync_engine
        #: This life's jobs in threads, by the task that follows each.
        self.jobs: dict[asyncio.Task[None], SyncRun] = {}
        self.raw: Any = None

    def plan(self, lone: bool) -> Plan:
        return Plan(take=False, limit=max(1, self.pool.free))

    @contextlib.asynccontextmanager
    async def opened(self, conn: AsyncConnection, raw: Any) -> AsyncIterator[None]:
        self.raw = raw  # it claims; the threads have connections of their own
        yield

    def ready(self) -> bool:
        return self.pool.free > 0

    async def wait_ready(self) -> None:
        await self.pool.wait_free(self.life.stop)

    def interrupt(self, job_id: uuid.UUID, reason: str) -> bool:
        """Stop the sync job `job_id` if it is one of this lane's (True): its
        handler, if its thread still runs it (`ThreadPool.interrupt`); the
        reason stays with the job either way, for what `_follow` makes of
        its outcome."""
        run = next((run for run in self.jobs.values() if run.job.id == job_id), None)
        if run is None:
            return False
        run.reason = reason
        if job_id in self.pool.running:
            asyncio.ensure_future(self.pool.interrupt(job_id, reason))
        return True

    def cancelled(self) -> set[uuid.UUID]:
        return {run.job.id for run in self.jobs.values() if run.reason == CANCELLED}

    async def settle_one(self) -> bool:
        if not self.jobs:
            return False
        await asyncio.wait(set(self.jobs), return_when=asyncio.FIRST_COMPLETED)
        return True

    async def finish(self) -> None:
        """The running sync handlers get to finish (the runner bounds that
        by the grace period)."""
        while self.jobs:
            await asyncio.wait(set(self.jobs))

    def cut(self) -> None:
        for task, run in list(self.jobs.items()):
            sever(run)
            task.cancel()

    async def run(self, started: Started, batch: BatchKind, queue: str,
                  cancels: set[uuid.UUID]) -> None:
        """The claim committed (no batch transaction); each job runs in a
        thread, in a transaction of its own, stopped by its timeout like an
        async handler (`ThreadPool.interrupt`). Each counts as a batch at the
        worker's alone gate while it runs; a job that must run alone is
        waited for here, so that nothing starts beside it."""
        gate, loop = self.life.alone, asyncio.get_running_loop()
        traces = None
        if tracing.tracer() is not None:
            rows = await queries["trace_contexts"].fetch(
                self.raw, ids=[job.id for job in started.jobs])
            traces = tracing.carriers(rows)
        tasks = []
        for job in started.jobs:
            run = SyncRun(job, reason=CANCELLED if job.id in cancels else None, traces=traces)
            gate.enter()
            done = self.pool.submit(run, self._in_thread)
            task = asyncio.create_task(self._follow(run, done, queue))
            self.jobs[task] = run
            task.add_done_callback(self.jobs.pop)
            task.add_done_callback(lambda _: gate.leave())
            timeout = timeout_of(job, self.life.registry)
            if timeout is not None:
                timer = loop.call_later(timeout, self._time_out, job.id, timeout)
                task.add_done_callback(_cancelling(timer))
            tasks.append(task)
        if batch is ALONE_CLAIM_ONLY:
            await asyncio.wait(tasks)

    def _time_out(self, job_id: uuid.UUID, timeout: float) -> None:
        self.interrupt(job_id, timed_out(timeout))

    async def _follow(self, run: SyncRun, done: asyncio.Future[Any], queue: str) -> None:
        """Count what the thread recorded; a job it could not record (its
        connection failed before the outcome was written) goes back to the
        queue, as a lane's jobs do when their batch's connection is lost.

        A job recorded waiting again (a retry, a snooze) is due at the time
        of that statement plus its delay, which nothing announces, and this
        lane went on claiming meanwhile: a claim whose snapshot began before
        the record committed may have set its floor past the job (with no
        delay, at once). So the floors go back to where the job waited
        before, which is never past where it waits now.

        A job that goes on waiting (a retry, a snooze, handed back) or to
        another worker is let go (`_let_go`)."""
        job = run.job
        try:
            recorded = await done
        except Exception as exc:
            if run.cut or self.life.abandon.is_set():
                return
            logger.error("sync job %s (%s): %s; it goes back to the queue", job.id,
                         job.job_type, one_line(exc),
                         extra={"event": "sync_job_lost", "job_id": str(job.id),
                                "job_type": job.job_type, "worker_id": self.worker_id,
                                "error": one_line(exc)})
            try:
                await self.life.hand_back([job.id])
            except Exception as again:  # the worker's connections went too: a rescue will
                logger.warning("sync job %s not handed back (%s); it waits for a rescue",
                               job.id, one_line(again))
            else:
                await self._let_go(run)
            return
        if recorded is None:  # no longer this worker's (or cut off)
            if not run.cut:
                await self._let_go(run)
            return
        out, latencies = recorded
        if any(out.retry) or out.snoozed_ids:
            self.life.floors.lower(queue, job.priority, job.run_at, job.id,
                                   job_type=job.job_type)
        self.life.stats.count_batch(out, latencies)
        log_completed([job], out, self.worker_id)
        if out.waiting_again():
            await self._let_go(run)

    async def _let_go(self, run: SyncRun) -> None:
        """The job goes on waiting, or to another worker: if it was cancelled
        meanwhile, the cancel is sent again; else it is remembered a while,
        for a cancel still on its way (`cancels.py`)."""
        if run.reason != CANCELLED:
            self.life.released.add([run.job.id])
            return
        try:
            await self.life.pass_on([run.job.id])
        except Exception as exc:  # the worker's connections are going: nothing to send on
            logger.warning("sync job %s: its cancel was not sent again (%s)", run.job.id,
                           one_line(exc), extra={"event": "cancel_not_passed_on",
                                                 "job_id": str(run.job.id),
                                                 "worker_id": self.worker_id})

    # -- in the thread -----------------------------------------------------------

    def _in_thread(self, run: SyncRun) -> tuple[Outcomes, list[float]] | None:
        """Run one sync job and record its outcome; what was recorded (None:
        nothing, the job was cut off or is no longer ours). Raises when its
        connection failed before the outcome was written."""
        token = _current_job.set(run.job)
        try:
            with self.sync_engine.connect() as conn:
                conn.info[RUN] = run
                run.driver = conn.connection.driver_connection
                try:
                    return self._run_and_record(conn, run)
                finally:
                    conn.info.pop(RUN, None)
                    run.driver = None
        finally:
            _current_job.reset(token)

    def _run_and_record(self, conn: Connection, run: SyncRun
                        ) -> tuple[Outcomes, list[float]] | None:
        job, out = run.job, Outcomes()
        started = time.perf_counter()
        span = None if run.traces is None else tracing.start_job(job, run.traces)
        outcome: Decided | None = None
        error: BaseException | None = None
        try:
            encoded = self._call_sync(conn, run)
            if run.cut:
                raise Interrupted("abandoned")
            out.success(job.id, encoded, time.perf_counter() - started)
            return out, _record(conn, run, out, self.worker_id)
        except LostOwnership:
            self._lost(conn, run)
            return None
        except Exception as exc:
            error = exc
            _roll_back(conn, run)  # the handler's writes are gone
            if run.cut:
                return None
            if is_connection_error(exc) and conn.invalidated:
                raise  # not the job's fault: it goes back (`_follow`)
            out = Outcomes()
            outcome = outcome_of(job, exc, run.reason, time.perf_counter() - started,
                                 self.config.retry_policy)
            note(job, outcome, out, self.worker_id)
            try:
                return out, _record(conn, run, out, self.worker_id)
            except LostOwnership:
                self._lost(conn, run)
                return None
        finally:
            if span is not None:
                tracing.finish_job(span, outcome, error, run.reason)

    def _call_sync(self, conn: Connection, run: SyncRun) -> str | None:
        """The handler, in a transaction on `conn` that its session joins;
        its encoded result, or the reason it fails (raised)."""
        job = run.job
        registry = self.life.registry
        handler = cast(SyncJobHandler | None, registry.get(job.job_type))
        if handler is None or not registry.is_sync(job.job_type):
            raise HandlerError(f"no sync handler registered for job type {job.job_type!r}")
        if run.reason is not None:  # cancelled before its thread started it
            raise Interrupted(run.reason)
        conn.begin()
        # Bound to a connection already in a transaction, the session joins
        # it instead of owning it: its close() leaves it open, its rollback()
        # rolls the job's back, its own commit() is refused (`HandlerSession`).
        session = HandlerSession(bind=conn, expire_on_commit=False)
        session.info[IN_HANDLER] = run.in_handler = True
        run.db_error = run.began = False
        try:
            result = handler(session, json.loads(job.payload))
            if inspect.isawaitable(result):
                with contextlib.suppress(Exception):
                    result.close()  # type: ignore[attr-defined]
                raise TypeError("a sync handler returned an awaitable: declare it async def")
            if session.in_nested_transaction():
                raise HandlerError(NESTED_LEFT_OPEN)
            session.flush()  # objects added but not flushed are the job's writes too
        finally:
            with run.guard:  # a statement cancel on its way lands before the outcome's
                session.info[IN_HANDLER] = run.in_handler = False
            session.close()
        if run.reason is not None:
            raise Interrupted(run.reason)
        return result_of(result, run.refused, run.db_error)

    def _lost(self, conn: Connection, run: SyncRun) -> None:
        _roll_back(conn, run)
        job = run.job
        logger.warning("sync job %s (%s) rolled back: another worker took it", job.id,
                       job.job_type, extra={"event": "batch_lost", "jobs": 1,
                                            "job_id": str(job.id), "worker_id": self.worker_id})
        return None


def _cancelling(timer: asyncio.TimerHandle) -> Callable[[Any], None]:
    """A done-callback that cancels `timer` (a job's timeout, once it has ended)."""
    return lambda _: timer.cancel()
