"""Running a lane's batch of async handlers: one transaction on the lane's
own connection, one commit, whatever the batch's size.

Handlers write through the lane's session, straight into the batch
(`handler.py`): *plain*, with no savepoint, until a job of their type fails
after touching the database. That failure cannot be undone alone, so the
batch rolls back and runs again with a savepoint per job (`recovery.py`:
what did not write keeps its outcome, what wrote runs again), and the type
keeps its savepoints from then on. A batch ends before it would open more
savepoints than PostgreSQL caches per transaction (`pacing.py`).

A batch is a pipeline of small steps: each attempt (`_attempt`) writes the
batch down if it was taken, runs its jobs (`_run_jobs`, each `_run_one`:
its handler, `_call`, then whether it may count as done, `_returned`),
records every outcome (`completer.record`) and commits; an attempt that
rolls back gives the attempts that follow it (`recovery.py`).

The transactions run on the asyncpg connection itself; SQLAlchemy sees the
connection in autocommit mode, so it never sends a BEGIN or COMMIT of its
own and a handler's session only ever adds savepoints to the lane's batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from jobqueue import tracing
from jobqueue.errors import is_connection_error, one_line
from jobqueue.registry import JobHandler
from jobqueue.schema.queries import queries
from jobqueue.worker.batch import LANE_KINDS, BatchKind, Deferred, Started, rollback
from jobqueue.worker.completer import LostOwnership, record
from jobqueue.worker.config import WorkerConfig
from jobqueue.worker.handler import (
    IN_HANDLER,
    NESTED_LEFT_OPEN,
    ClaimedJob,
    HandlerError,
    JobInterrupted,
    LaneState,
    _current_job,
    refuse_handler_commit,
    result_of,
    state_of,
)
from jobqueue.worker.interrupt import Stopper
from jobqueue.worker.life import Life
from jobqueue.worker.outcome import (
    Decided,
    Outcomes,
    cancelled,
    failed_at_commit,
    failure,
    log_completed,
    note,
    outcome_of,
    overturn,
    timeout_of,
)
from jobqueue.worker.pacing import Pacing, Plan
from jobqueue.worker.recovery import (
    Attempt,
    Rerun,
    after_cancel,
    after_error,
    after_rerun,
    decided_of,
)

logger = logging.getLogger("jobqueue.worker")


class AsyncExecutor:
    """Runs the batches of one lane's async job types on its connection."""

    kinds = LANE_KINDS

    def __init__(self, config: WorkerConfig, life: Life, number: int) -> None:
        self.config = config
        self.life = life
        self.number = number
        self.worker_id = life.worker_id
        #: What the recent batches took, and so how to take the next one.
        self.pacing = Pacing(config.batch_size, config.quick_batch)
        #: The lane's connection (asyncpg's, and SQLAlchemy's) and the
        #: handlers' session on it, while the lane has them (`opened`).
        self.raw: Any = None
        self._conn: Any = None
        self._session: Any = None
        self.stopper: Stopper | None = None

    def plan(self, lone: bool) -> Plan:
        return self.pacing.plan(lone)

    @contextlib.asynccontextmanager
    async def opened(self, conn: AsyncConnection, raw: Any) -> AsyncIterator[None]:
        """The handlers' session for the lane connection's life, in one
        SQLAlchemy transaction that sends no SQL (each job's savepoint comes
        from the engine's hooks), and what stops a running handler."""
        self.raw = raw
        session = AsyncSession(bind=conn, expire_on_commit=False)
        state = state_of(conn.info)
        event.listen(session.sync_session, "before_commit", refuse_handler_commit)
        event.listen(session.sync_session, "transient_to_pending",
                     lambda _session, _instance: setattr(state, "added", True))
        stopper = self.stopper = Stopper(state, session.info, self.life.cancel_statement)
        stopper.task = asyncio.current_task()
        stopper.pid = raw.get_server_pid()
        self._conn, self._session = conn, session
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                await session.close()

    def interrupt(self, job_id: uuid.UUID, reason: str) -> bool:
        """Stop the handler of `job_id` if it is the one running (`interrupt.py`)."""
        return self.stopper is not None and self.stopper.stop(job_id, reason)

    def cancelled(self) -> set[uuid.UUID]:
        return set()  # its jobs are the lane's batch, whose cancels the lane keeps

    def ready(self) -> bool:
        return True  # one batch at a time, on the lane's own task

    async def wait_ready(self) -> None:
        return None

    async def settle_one(self) -> bool:
        return False  # nothing runs beside the lane

    async def finish(self) -> None:
        return None

    def cut(self) -> None:
        return None  # the lane cuts its connection, and with it the batch

    async def run(self, started: Started, batch: BatchKind, queue: str,
                  cancels: set[uuid.UUID]) -> None:
        """Run a batch: its first attempt in the transaction it started with,
        then, if that rolled back, the attempts `recovery.py` gives, each in a
        new transaction (`batch.again`), until none is left. `cancels`: the
        jobs of the batch cancelled since it began (the lane adds to it)."""
        attempts = [Attempt(started.jobs)]
        held: Started | None = started
        while attempts:
            attempt = attempts.pop(0)
            if held is None:
                held = await batch.again(self.raw, attempt.jobs)
                retaken = set() if held is None else {job.id for job in held.jobs}
                if len(retaken) < len(attempt.jobs):  # taken jobs another worker took meanwhile
                    await self._let_go([j.id for j in attempt.jobs if j.id not in retaken],
                                       cancels)
                if held is None:
                    continue
            attempts[:0] = await self._attempt(held, batch, attempt, queue, cancels)
            held = None

    async def _attempt(self, held: Started, batch: BatchKind, attempt: Attempt, queue: str,
                       cancels: set[uuid.UUID]) -> list[Attempt]:
        """One attempt, in `held`'s open transaction: run its jobs, record
        every outcome, commit; the attempts that must follow (none when it
        committed, or when its jobs went back to the queue). A quick batch's
        jobs that it did not record (it rolled back, or stopped early) wait
        again where they were, behind this lane's floor, which goes back to
        them.

        Cancels heard while the batch ran apply to the outcomes decided
        before them, up to their record (`outcome.overturn`); a job they
        find done after writing takes the batch back (`after_cancel`). The
        jobs the batch leaves waiting are let go (`_let_go`): a cancel heard
        after that point is sent again (`cancels.py`)."""
        life, tx, jobs = self.life, held.tx, held.jobs
        left: list[uuid.UUID] | None = None  # committed unrecorded (None: rolled back)
        touched: set[uuid.UUID] = set()
        try:
            if held.xid is not None:
                await life.record_batch(self.number, held.xid, [job.id for job in jobs])
            if attempt.failed is not None:
                out = failed_at_commit(jobs[0], attempt.failed, self.config.retry_policy,
                                       self.worker_id)
            else:
                out = Outcomes()
                touched = await self._run_jobs(jobs, batch, attempt, out, cancels,
                                               begun=not isinstance(tx, Deferred))
            if cancels and (wrote := self._cancelled_after_writing(jobs, out, cancels,
                                                                    touched)):
                await rollback(tx)
                again, rerun = after_cancel(attempt, out, touched, wrote, self.worker_id)
                life.stats.rerun += rerun
                return again
            latencies = await record(self.raw, self.worker_id, out, batch, jobs)
            await tx.commit()
            left = out.not_started
        except Rerun as rerun:
            await rollback(tx)
            life.stats.rerun += rerun.again
            pacing = self.pacing  # claim batches of SAVEPOINT_LIMIT from now on
            pacing.savepoints_per_job = max(pacing.savepoints_per_job, 1.0)
            return after_rerun(jobs, rerun, self.worker_id)
        except LostOwnership:
            await rollback(tx)
            logger.warning("batch of %d rolled back: another worker took some of its jobs",
                           len(jobs), extra={"event": "batch_lost", "jobs": len(jobs),
                                             "worker_id": self.worker_id})
            await self._hand_back(batch, jobs, cancels)
            return []
        except Exception as exc:
            await rollback(tx)
            if life.abandon.is_set() or attempt.failed is not None:
                raise
            if not is_connection_error(exc):
                return after_error(attempt, exc, self.worker_id)
            logger.error("lane %d: connection lost mid-batch; %d job(s) go back to the queue",
                         self.number, len(jobs),
                         extra={"event": "batch_connection_lost", "lane": self.number,
                                "jobs": len(jobs), "worker_id": self.worker_id,
                                "error": one_line(exc)})
            await self._hand_back(batch, jobs, cancels)
            raise
        except BaseException:
            await rollback(tx)
            raise
        finally:
            if batch.taken and left != []:
                unrecorded = None if left is None else set(left)
                life.floors.released(self.number, queue, [
                    job for job in jobs if unrecorded is None or job.id in unrecorded])
        life.stats.count_batch(out, latencies)
        log_completed(jobs, out, self.worker_id)  # committed: now they are done
        if out.failed_ids or out.snoozed_ids or out.not_started:
            await self._let_go(out.waiting_again(), cancels)
        return []

    def _cancelled_after_writing(self, jobs: list[ClaimedJob], out: Outcomes,
                                 cancels: set[uuid.UUID], touched: set[uuid.UUID]
                                 ) -> set[uuid.UUID]:
        """Apply the cancels heard while the batch ran (`outcome.overturn`);
        the jobs among them whose handlers had succeeded after writing: only
        the batch's rollback takes those writes away."""
        wrote = touched.intersection(out.done_ids)
        return overturn(jobs, out, cancels, self.worker_id) & wrote

    async def _let_go(self, ids: list[uuid.UUID], cancels: set[uuid.UUID]) -> None:
        """Jobs the lane lets go still waiting: the cancels it heard for them
        are sent again (`Life.pass_on`), and the others are remembered a
        while, for a cancel still on its way (`cancels.Released`)."""
        heard = [job_id for job_id in ids if job_id in cancels] if cancels else []
        self.life.released.add([job_id for job_id in ids if job_id not in cancels]
                               if heard else ids)
        if heard:
            await self.life.pass_on(heard)

    async def _hand_back(self, batch: BatchKind, jobs: list[ClaimedJob],
                         cancels: set[uuid.UUID]) -> None:
        """The batch rolled back and will not run again here: its jobs go back
        to the queue as `batch`'s rule says, and the cancels it heard with them."""
        ids = [job.id for job in jobs]
        back = batch.to_hand_back(ids)
        if back:
            await self.life.hand_back(back)
        await self._let_go(ids, cancels)

    async def _run_jobs(self, jobs: list[ClaimedJob], batch: BatchKind, attempt: Attempt,
                        out: Outcomes, cancels: set[uuid.UUID], begun: bool = True
                        ) -> set[uuid.UUID]:
        """The batch's handlers, one after another, until done or full
        (`Pacing.full`); the `decided` jobs' outcomes first, without running
        them. Not `begun`: the first handler statement begins the
        transaction. The jobs whose handlers touched the database."""
        config, pacing, worker_id = self.config, self.pacing, self.worker_id
        always = attempt.isolated or config.savepoints == "always"
        decided, isolated_types = attempt.decided, self.life.isolated_types
        taken, stop = batch.taken, self.life.stop
        state = state_of(self._conn.info)
        state.start_transaction(begun)
        for job in jobs:
            if job.id in decided:
                note(job, decided[job.id], out, worker_id)
        todo = [job for job in jobs if job.id not in decided]
        traces = await self._traces(todo) if tracing.tracer() is not None else None
        touched_ids: set[uuid.UUID] = set()
        started, ran = time.perf_counter(), 0
        for n, job in enumerate(todo):
            if stop.is_set() or (ran and pacing.full(taken, time.perf_counter() - started,
                                                      state.savepoints, job.job_type)):
                out.not_started = [job.id for job in todo[n:]]
                break
            if cancels and job.id in cancels:  # cancelled while it waited in the batch
                note(job, cancelled(), out, worker_id)
                continue
            opened = state.savepoints
            try:
                await self._run_one(job, out, state, always or job.job_type in isolated_types,
                                    traces)
            except Rerun as rerun:
                rerun.decided, rerun.again = decided_of(out, touched_ids, rerun)
                raise
            if state.touched:
                touched_ids.add(job.id)
            if state.savepoints > opened:  # most jobs open none: no call
                pacing.opened(job.job_type, state.savepoints - opened)
            ran += 1
        if ran:
            pacing.ran(time.perf_counter() - started, ran, state.savepoints)
        return touched_ids

    async def _traces(self, jobs: list[ClaimedJob]) -> tracing.Traces:
        """Where the jobs' traces come from (`tracing.py`), read for tracing
        only: the claims do not carry it."""
        rows = await queries["trace_contexts"].fetch(self.raw, ids=[job.id for job in jobs])
        return tracing.carriers(rows)

    async def _run_one(self, job: ClaimedJob, out: Outcomes, state: LaneState,
                       isolated: bool, traces: tracing.Traces | None = None) -> None:
        """Run one job's handler and note its outcome in `out`. Raises Rerun
        when a plain job's writes cannot be undone alone.

        A handler that raises `Snooze` is due again later, its attempt not
        counted; one stopped by its timeout fails like any failure; one
        cancelled fails for good. Either way its writes roll back alone."""
        session, policy = self._session, self.config.retry_policy
        handler = self.life.registry.get(job.job_type)
        if handler is None:
            # Claimed for a handler that is gone (removed since the claim): a
            # failed attempt, retried, for a worker that still has it.
            note(job, failure(job, f"no handler registered for job type {job.job_type!r}",
                              policy), out, self.worker_id)
            return
        started = time.perf_counter()
        token = _current_job.set(job)
        state.start_job(isolated)
        stopped: list[str] = []  # why it was stopped, if it was
        span = None if traces is None else tracing.start_job(job, traces)
        outcome: Decided | None = None
        error: BaseException | None = None
        try:
            result = await self._call(handler, job, stopped)
            encoded = await self._returned(state, job, result)
        except Rerun as rerun:
            error = rerun
            raise
        except Exception as exc:
            error = exc
            # Back to the job's savepoint: its writes vanish, its batch-mates' stay.
            if session.in_transaction():
                await session.rollback()
            await state.roll_back_job(self.raw)
            if is_connection_error(exc) and self._connection_lost():
                raise  # not the job's fault: the whole batch goes back
            outcome = outcome_of(job, exc, stopped[0] if stopped else None,
                                 time.perf_counter() - started, policy)
            if not isolated and state.touched:
                # Before the batch rolls back and frees its jobs: another lane
                # that takes this type meanwhile must already isolate it.
                self.life.isolated_types.add(job.job_type)
                raise Rerun(job, outcome) from exc
            note(job, outcome, out, self.worker_id)
        else:
            out.success(job.id, encoded, time.perf_counter() - started)
        finally:
            if span is not None:
                tracing.finish_job(span, outcome, error, stopped[0] if stopped else None,
                                   rerun=isinstance(error, Rerun))
            state.end_job()
            _current_job.reset(token)
            if session.identity_map:
                session.expunge_all()

    def _connection_lost(self) -> bool:
        """Did the lane's own connection fail? A handler's `ConnectionError`
        or `TimeoutError` from some other service (SMTP, HTTP) is the job's
        failure, not a reason to send the whole batch back."""
        return self._conn.invalidated or self.raw is None or self.raw.is_closed()

    async def _call(self, handler: JobHandler, job: ClaimedJob, stopped: list[str]) -> Any:
        """The handler's result, run so that its timeout or a cancel can stop it
        (`interrupt.py`); a stop is raised as JobInterrupted even if the
        handler swallowed it, and its reason is put in `stopped`."""
        stopper, session_info = self.stopper, self._session.info
        assert stopper is not None
        stopper.start(job.id, timeout_of(job, self.life.registry))
        session_info[IN_HANDLER] = True
        try:
            result = await handler(self._session, json.loads(job.payload))
        except asyncio.CancelledError:
            if stopper.reason is None or self.life.abandon.is_set():
                raise  # the worker is cutting its lanes off: not this job's stop
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            result = None
        finally:
            session_info[IN_HANDLER] = False
            reason = stopper.finish()
            if reason is not None:  # whatever the handler raised on its way out
                stopped.append(reason)
                if stopper.cancelling:
                    await stopper.settled()
        if reason is not None:
            raise JobInterrupted(reason)
        return result

    async def _returned(self, state: LaneState, job: ClaimedJob, result: Any) -> str | None:
        """A handler returned: may its job count as done? Its encoded result,
        or the reason it fails (raised)."""
        session = self._session
        if session.in_nested_transaction():
            raise HandlerError(NESTED_LEFT_OPEN)
        if _pending(session.sync_session, state.added):
            await session.flush()  # objects added but not flushed are the job's writes too
        encoded = result_of(result, state.refused, state.db_error)
        if state.undo:  # its session rolled back writes we cannot undo alone
            self.life.isolated_types.add(job.job_type)
            raise Rerun(job, None)
        return encoded


def _pending(session: Any, added: bool) -> bool:
    """Has the handler left ORM changes unflushed? New objects only if it
    `added` some; changed and deleted ones are in the identity map, which is
    empty for handlers that use no ORM objects: checked first, it keeps this
    cheap."""
    return bool((added and session.new)
                or (session.identity_map and (session.dirty or session.deleted)))
