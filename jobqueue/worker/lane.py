"""A lane: one connection that takes a batch of jobs, runs it, commits it, and again.

A batch is one transaction and one commit, whatever its size; one `complete`
and one `fail` statement record every outcome. Handlers write through the
lane's session, straight into the batch (`handler.py`): *plain*, with
no savepoint, until a job of their type fails after touching the database.
That failure cannot be undone alone, so the batch rolls back and runs again
with a savepoint per job (`recovery.py`: what did not write keeps its
outcome, what wrote runs again), and the type keeps its savepoints from then
on. A batch ends before it would open more savepoints than PostgreSQL caches
per transaction (64).

A batch is taken or claimed, as the lane's `Pacing` plans from what its
recent batches took (`pacing.py`):

- **taken**, a *quick batch*: locked inside the batch's own transaction
  (`take`), run, recorded, committed. One new row version per job; a crash
  rolls everything back and the jobs are simply waiting again. Their status
  goes from `pending` straight to `completed`: nobody could have watched a
  `processing` that lasts milliseconds.
- **claimed**: the claim commits first (`claim`), so the job shows
  `processing` with this worker's id while it runs; the outcome checks that
  the worker still owns it (if another worker took it meanwhile, this one was
  declared hung: nothing commits).

`batch.py` has each way's rule for the jobs a batch does not finish.

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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from jobqueue.errors import is_connection_error, one_line
from jobqueue.registry import HandlerRegistry, JobHandler
from jobqueue.schema.locks import CANCELLED
from jobqueue.schema.queries import queries
from jobqueue.worker.alone import AloneGate
from jobqueue.worker.batch import (
    ALONE,
    CLAIMED,
    DONE,
    FAILED,
    LIMITED,
    SNOOZED,
    TAKEN,
    BatchKind,
    Decided,
    Deferred,
    LostOwnership,
    Outcomes,
    Started,
    rollback,
)
from jobqueue.worker.book import QueueBook
from jobqueue.worker.config import WorkerConfig
from jobqueue.worker.doorbell import Doorbell
from jobqueue.worker.floors import NO_ARMS, Arms, Floors
from jobqueue.worker.handler import (
    IN_HANDLER,
    ClaimedJob,
    HandlerCommitError,
    HandlerError,
    JobInterrupted,
    LaneState,
    Snooze,
    SwallowedDatabaseError,
    _current_job,
    encode_result,
    error_text,
    refuse_handler_commit,
    state_of,
)
from jobqueue.worker.interrupt import Stopper
from jobqueue.worker.pacing import Pacing, Plan
from jobqueue.worker.recovery import Attempt, Rerun, after_error, after_rerun, decided_of
from jobqueue.worker.stats import WorkerStats

logger = logging.getLogger("jobqueue.worker")


@dataclass(frozen=True)
class Life:
    """What a worker's lanes share during one life (one worker id): given by
    the runner, so that a lane needs neither the runner nor its attributes."""

    worker_id: int
    registry: HandlerRegistry
    stats: WorkerStats
    #: Job types that failed after writing without a savepoint: they run in
    #: savepoints from then on (`savepoints="auto"`); kept across lives.
    isolated_types: set[str]
    #: Wakes idle lanes when new jobs may be due (a notification, or a stop).
    bell: Doorbell
    #: Set by a stop request: take no new batch, start no new job.
    stop: asyncio.Event
    #: Set when running lanes are being cut off on purpose: their errors are expected.
    abandon: asyncio.Event
    #: Return claimed jobs to the queue on the worker's monitor connection.
    hand_back: Callable[[list[uuid.UUID] | None], Awaitable[int]]
    #: Cancel the statement a backend runs (by pid), from the monitor connection.
    cancel_statement: Callable[[int], Awaitable[Any]]
    #: Write down a quick batch before it runs: (lane, transaction id, job ids).
    record_batch: Callable[[int, int, list[uuid.UUID]], Awaitable[Any]]
    #: Where the lanes make room for a job that must run alone.
    alone: AloneGate
    #: The queues as this worker last saw them (waiting jobs, settings).
    book: QueueBook
    #: Where each lane's claims start, per queue and priority (`floors.py`).
    floors: Floors
    #: The job types it has handlers for: the only ones it claims.
    job_types: list[str]


class Lane:
    """One of a worker's `concurrency` lanes."""

    def __init__(self, config: WorkerConfig, life: Life, engine: AsyncEngine,
                 number: int, serves: tuple[str, ...] | None = None) -> None:
        self.config = config
        #: The queues this lane takes from (None: every queue with waiting jobs).
        self.serves = serves
        #: Where the next batch's turn among the queues starts: lanes start
        #: apart, so two lanes do not take from the same queue in lockstep.
        self.turn = number
        #: The queues the last empty round tried.
        self.tried: set[str] = set()
        self.life = life
        #: Lanes of one kind run the same job types (`doorbell.py`).
        self.kind = tuple(life.job_types)
        life.bell.join(self.kind)
        self.worker_id = life.worker_id
        self.registry = life.registry
        self.isolated_types = life.isolated_types
        self.engine = engine
        self.number = number
        self.raw: Any = None  # the asyncpg connection, to cut it off when abandoning
        #: What the recent batches took, and so how to take the next one.
        self.pacing = Pacing(config.batch_size, config.quick_batch)
        #: The jobs of the batch running now, and those of them cancelled
        #: before they started; what stops the running handler.
        self.batch: list[ClaimedJob] = []
        self.cancels: set[uuid.UUID] = set()
        #: A claim is on its way (`_claim`), and the cancels heard meanwhile
        #: for jobs this lane does not hold yet: the claim may bring them.
        self.claiming = False
        self.heard: set[uuid.UUID] = set()
        self.stopper: Stopper | None = None
        #: The queue of the batch running now.
        self.queue = ""

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

    @property
    def stopping(self) -> bool:
        return self.life.stop.is_set()

    def interrupt(self, job_id: uuid.UUID, reason: str) -> bool:
        """Stop job `job_id` if this lane holds it (True): its handler, if it
        is running (`interrupt.py`), or the job before it starts."""
        if self.stopper is not None and self.stopper.stop(job_id, reason):
            return True
        if any(job.id == job_id for job in self.batch):
            self.cancels.add(job_id)
            return True
        if self.claiming:
            self.heard.add(job_id)  # `_claim` looks at it when the claim is back
        return False

    def cut(self) -> None:
        """Close the connection at once (abandoning: its transaction rolls back)."""
        if self.raw is not None and not self.raw.is_closed():
            self.raw.terminate()

    def plan(self) -> Plan:
        """How to take the next batch (`pacing.py`)."""
        return self.pacing.plan()

    async def _loop(self, conn: AsyncConnection) -> None:
        bell = self.life.bell
        # One session for the lane's life, in one SQLAlchemy transaction that
        # sends no SQL; each job's savepoint comes from the engine's hooks.
        session = AsyncSession(bind=conn, expire_on_commit=False)
        event.listen(session.sync_session, "before_commit", refuse_handler_commit)
        self.stopper = Stopper(state_of(conn.info), session.info, self.life.cancel_statement)
        self.stopper.task = asyncio.current_task()
        self.stopper.pid = self.raw.get_server_pid()
        try:
            while not self.stopping:
                bell.clear(self.serves, self.kind)
                if not await self._next_batch(conn, session) \
                        and not await self._wait_for_work():
                    return
        finally:
            with contextlib.suppress(Exception):
                await session.close()

    async def _next_batch(self, conn: AsyncConnection, session: AsyncSession) -> bool:
        """Take and run one batch; False when nothing was due.

        The queues take turns: the batch comes from the first of them, from
        this lane's turn on, that has a due job it may take, and the next turn
        starts after it. So every queue with due jobs gets a batch within one
        round, whatever floods another."""
        gate = self.life.alone
        if gate.wanted and await self._run_alone(conn, session):
            return True
        book, raw, floors = self.life.book, self.raw, self.life.floors
        await book.read_settings(raw)
        queues = self.serves or book.known()
        take, limit = self.plan()
        async with gate.batch():
            for step in range(len(queues)):
                queue = queues[(self.turn + step) % len(queues)]
                if book.paused(queue):
                    continue
                batch = self.batch_kind(queue, take)
                started = await self._claim(batch, limit, queue, floors.arms(self.number, queue))
                if started is not None:
                    lone = self.pacing.lone = started.jobs[-1].floor_id is None
                    if not lone:  # more are due than it took: wake a lane to help
                        self.life.bell.ring(queue)
                    floors.advance(self.number, queue, started.jobs)
                    self.turn = (self.turn + step + 1) % len(queues)
                    await self._run_held(conn, session, started, batch)
                    return True
        self.tried = set(queues)
        if gate.look(self.config.poll_interval):  # nothing else to do: any lone jobs?
            return await self._run_alone(conn, session)
        return False

    async def _claim(self, kind: BatchKind, limit: int, queue: str, arms: Arms
                     ) -> Started | None:
        """Take or claim a batch from `queue` (`kind.start`), and hold its jobs
        from the moment the reply is back: a cancel for one of them from then
        on stops it (`interrupt`). A cancel can also overtake the reply: the
        job was locked or `processing` when it was cancelled, so its
        notification went out, and the event loop may deliver it before
        this task runs again. Those heard while the claim was on its way are
        kept, and a job of the batch among them fails `cancelled` unstarted."""
        self.claiming = True
        try:
            started = await kind.start(self.raw, limit, self.worker_id, queue,
                                       self.life.job_types, arms)
        finally:
            self.claiming = False
            heard, self.heard = self.heard, set()
        if started is not None:
            self.queue = queue
            self.batch = started.jobs
            self.cancels = {job.id for job in started.jobs if job.id in heard}
        return started

    async def _run_held(self, conn: AsyncConnection, session: AsyncSession, started: Started,
                        batch: BatchKind) -> None:
        try:
            await self._run_batch(conn, session, started, batch)
        finally:
            self.batch = []
            self.cancels.clear()
            if self.config.burst:
                # A sibling lane that found this batch's jobs due but locked
                # waits to look again; once they are done it may be the end
                # of the run, so it should not sleep out its poll interval.
                self.life.bell.ring()

    async def _run_alone(self, conn: AsyncConnection, session: AsyncSession) -> bool:
        """Run the due jobs that must run alone (`alone.py`), one at a time,
        with no other batch of this worker running; False if there were none.
        Asks the database first, so a worker with none pays one small query."""
        gate, life, raw = self.life.alone, self.life, self.raw
        gate.wanted = False
        served = self.config.served
        queues = None if served is None else list(served)
        ran = False
        while not self.stopping:
            waiting = await queries["alone_waiting"].fetch(raw, job_types=life.job_types,
                                                           queues=queues)
            due = [row["queue"] for row in waiting if row["due_in"] <= 0]
            if not due:
                gate.want_in(min((row["due_in"] for row in waiting), default=None))
                return ran
            async with gate.alone(self.number) as soloist:
                if not soloist:
                    return ran  # another lane is at it; this one waits at the gate
                for queue in due:
                    kind = self.alone_kind()
                    started = await self._claim(kind, 1, queue, NO_ARMS)
                    if started is not None:
                        await self._run_held(conn, session, started, kind)
                        ran = True
                        break
                else:
                    return ran  # due, but not ours to take now (a limit, another worker)
        return ran

    def batch_kind(self, queue: str, take: bool) -> BatchKind:
        """How a batch from `queue` holds its jobs: claimed one claimer at a
        time if the queue is limited, else taken or claimed as planned."""
        return LIMITED if self.life.book.limited(queue) else TAKEN if take else CLAIMED

    def timeout_of(self, job: ClaimedJob) -> float | None:
        """The job's own timeout, else its type's default (`register(timeout=)`)."""
        return job.timeout if job.timeout is not None else self.registry.timeout(job.job_type)

    def alone_kind(self) -> BatchKind:
        """How this lane claims a job that must run alone."""
        return ALONE

    async def _wait_for_work(self) -> bool:
        """Sleep until a job may be due. False when a burst run is done."""
        book = self.life.book
        await book.look(self.raw, self.life.floors)
        if self.serves is None and any(due <= 0 for queue, due in book.waiting.items()
                                       if queue not in self.tried):
            return True  # a queue this lane has not tried yet: try it at once
        if self.config.burst:
            due_in = await queries["next_due"].fetchval(
                self.raw, job_types=self.life.job_types,
                queues=None if self.serves is None else list(self.serves))
            if due_in is None or due_in > 0:
                return False
        else:
            due_in = book.due_in(self.serves)
        timeout = self.config.poll_interval
        if due_in is not None and due_in > 0:
            timeout = min(timeout, float(due_in))
        await self.life.bell.wait(timeout, self.serves, self.kind)
        return True

    async def _run_batch(self, conn: AsyncConnection, session: AsyncSession, started: Started,
                         batch: BatchKind) -> None:
        """Run a batch: its first attempt in the transaction it started with,
        then, if that rolled back, the attempts `recovery.py` gives, each in a
        new transaction (`batch.again`), until none is left."""
        attempts = [Attempt(started.jobs)]
        held: Started | None = started
        while attempts:
            attempt = attempts.pop(0)
            if held is None:
                held = await batch.again(self.raw, attempt.jobs)
                if held is None:
                    continue  # taken jobs another worker took meanwhile
            attempts[:0] = await self._attempt(conn, session, held, batch, attempt)
            held = None

    async def _attempt(self, conn: AsyncConnection, session: AsyncSession, held: Started,
                       batch: BatchKind, attempt: Attempt) -> list[Attempt]:
        """One attempt, in `held`'s open transaction: run its jobs, record
        every outcome, commit; the attempts that must follow (none when it
        committed, or when its jobs went back to the queue). A quick batch's
        jobs that it did not record (it rolled back, or stopped early) wait
        again where they were, behind this lane's floor, which goes back to
        them."""
        life, tx, jobs = self.life, held.tx, held.jobs
        left: list[uuid.UUID] | None = None  # committed unrecorded (None: rolled back)
        try:
            if held.xid is not None:
                await life.record_batch(self.number, held.xid, [job.id for job in jobs])
            if attempt.failed is not None:
                out = self._failed_at_commit(jobs[0], attempt.failed)
            else:
                out = Outcomes()
                await self._run_jobs(conn, session, jobs, batch, attempt, out,
                                     begun=not isinstance(tx, Deferred))
            latencies = await self._record(out, batch, jobs)
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
            await self._hand_back(batch, jobs)
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
            await self._hand_back(batch, jobs)
            raise
        except BaseException:
            await rollback(tx)
            raise
        finally:
            if batch.taken and left is None:
                life.floors.released(self.number, self.queue, jobs)
            elif batch.taken and left:
                unrecorded = set(left)
                life.floors.released(self.number, self.queue,
                                     [job for job in jobs if job.id in unrecorded])
        life.stats.count_batch(out, latencies)
        if out.done_ids and logger.isEnabledFor(logging.DEBUG):
            self._log_completed(jobs, out)  # committed: now they are done
        return []

    def _failed_at_commit(self, job: ClaimedJob, exc: Exception) -> Outcomes:
        """A job that could not commit even alone fails without its writes,
        its attempt counted."""
        out = Outcomes()
        retry = job.retry_count < job.max_retries
        delay = self.config.retry_policy.delay(job.attempt) if retry else 0.0
        out.failure(job.id, error_text(exc), retry=retry, delay=delay)
        logger.warning("job %s (%s) attempt %d failed at commit: %s", job.id, job.job_type,
                       job.attempt, error_text(exc),
                       extra={"event": "job_failed", "job_id": str(job.id),
                              "job_type": job.job_type, "attempt": job.attempt,
                              "worker_id": self.worker_id, "retry": retry,
                              "error": error_text(exc)})
        return out

    async def _hand_back(self, batch: BatchKind, jobs: list[ClaimedJob]) -> None:
        """The batch rolled back and will not run again here: its jobs go back
        to the queue as `batch`'s rule says."""
        ids = batch.to_hand_back([job.id for job in jobs])
        if ids:
            await self.life.hand_back(ids)

    async def _run_jobs(self, conn: AsyncConnection, session: AsyncSession,
                        jobs: list[ClaimedJob], batch: BatchKind, attempt: Attempt,
                        out: Outcomes, begun: bool = True) -> None:
        """The batch's handlers, one after another, until done or `_full`;
        the `decided` jobs' outcomes first, without running them. Not
        `begun`: the first handler statement begins the transaction."""
        always = attempt.isolated or self.config.savepoints == "always"
        decided = attempt.decided
        pacing = self.pacing
        taken, isolated_types, stop = batch.taken, self.isolated_types, self.life.stop
        state, session_info = state_of(conn.info), session.info
        state.start_transaction(begun)
        for job in jobs:
            if job.id in decided:
                self._note(job, decided[job.id], out)
        todo = self.batch = [job for job in jobs if job.id not in decided]
        cancels = self.cancels
        touched_ids: set[uuid.UUID] = set()
        started, ran = time.perf_counter(), 0
        for n, job in enumerate(todo):
            if stop.is_set() or (ran and pacing.full(taken, time.perf_counter() - started,
                                                      state.savepoints, job.job_type)):
                out.not_started = [job.id for job in todo[n:]]
                break
            if cancels and job.id in cancels:  # cancelled while it waited in the batch
                self._note(job, self._failure(job, CANCELLED, final=True), out)
                continue
            opened = state.savepoints
            try:
                await self._run_one(conn, session, job, out, state, session_info,
                                    always or job.job_type in isolated_types)
            except Rerun as rerun:
                rerun.decided, rerun.again = decided_of(out, touched_ids, rerun)
                raise
            if state.touched:
                touched_ids.add(job.id)
            pacing.opened(job.job_type, state.savepoints - opened)
            ran += 1
        if ran:
            pacing.ran(time.perf_counter() - started, ran, state.savepoints)

    async def _run_one(self, conn: AsyncConnection, session: AsyncSession, job: ClaimedJob,
                       out: Outcomes, state: LaneState, session_info: dict[Any, Any],
                       isolated: bool) -> None:
        """Run one job's handler and note its outcome in `out`. Raises Rerun
        when a plain job's writes cannot be undone alone.

        A handler that raises `Snooze` is due again later, its attempt not
        counted; one stopped by its timeout fails like any failure; one
        cancelled fails for good. Either way its writes roll back alone."""
        handler = self.registry.get(job.job_type)
        if handler is None:
            # Claimed for a handler that is gone (removed since the claim): a
            # failed attempt, retried, for a worker that still has it.
            self._note(job, self._failure(
                job, f"no handler registered for job type {job.job_type!r}"), out)
            return
        started = time.perf_counter()
        token = _current_job.set(job)
        state.start_job(isolated)
        stopped: list[str] = []  # why it was stopped, if it was
        try:
            result = await self._call(handler, session, job, session_info, stopped)
            encoded = await self._returned(session, state, job, result)
        except Rerun:
            raise
        except Exception as exc:
            # Back to the job's savepoint: its writes vanish, its batch-mates' stay.
            if session.in_transaction():
                await session.rollback()
            await state.roll_back_job(self.raw)
            if is_connection_error(exc) and self._connection_lost(conn):
                raise  # not the job's fault: the whole batch goes back
            outcome = self._outcome_of(job, exc, stopped, time.perf_counter() - started)
            if not isolated and state.touched:
                # Before the batch rolls back and frees its jobs: another lane
                # that takes this type meanwhile must already isolate it.
                self.isolated_types.add(job.job_type)
                raise Rerun(job, outcome) from exc
            self._note(job, outcome, out)
        else:
            out.success(job.id, encoded, time.perf_counter() - started)
        finally:
            state.end_job()
            _current_job.reset(token)
            if session.identity_map:
                session.expunge_all()

    async def _call(self, handler: JobHandler, session: AsyncSession, job: ClaimedJob,
                    session_info: dict[Any, Any], stopped: list[str]) -> Any:
        """The handler's result, run so that its timeout or a cancel can stop it
        (`interrupt.py`); a stop is raised as JobInterrupted even if the
        handler swallowed it, and its reason is put in `stopped`."""
        stopper = self.stopper
        assert stopper is not None
        stopper.start(job.id, self.timeout_of(job))
        session_info[IN_HANDLER] = True
        try:
            result = await handler(session, json.loads(job.payload))
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

    def _outcome_of(self, job: ClaimedJob, exc: Exception, stopped: list[str],
                    seconds: float) -> Decided:
        """What a handler's exception makes of its attempt: stopped by its
        timeout (a failure) or a cancel (failed for good), a snooze, or a failure."""
        if stopped:
            return self._failure(job, stopped[0], final=stopped[0] == CANCELLED, seconds=seconds)
        if isinstance(exc, Snooze):
            return Decided(SNOOZED, None, seconds, False, exc.seconds, False)
        return self._failure(job, error_text(exc), seconds=seconds)

    async def _returned(self, session: AsyncSession, state: LaneState, job: ClaimedJob,
                        result: Any) -> str | None:
        """A handler returned: may its job count as done? Its encoded result,
        or the reason it fails (raised)."""
        if session.in_nested_transaction():
            # Left open, the next job's rollback would reach back into it.
            raise HandlerError("the handler returned inside a begin_nested() it opened")
        if state.refused is not None:
            raise HandlerCommitError(state.refused)
        if _pending(session.sync_session):
            await session.flush()  # objects added but not flushed are the job's writes too
        if state.db_error:
            state.db_error = False
            raise SwallowedDatabaseError(
                "the handler caught a database error and went on; its writes are void")
        encoded = encode_result(result)
        if state.undo:  # its session rolled back writes we cannot undo alone
            self.isolated_types.add(job.job_type)
            raise Rerun(job, None)
        return encoded

    def _failure(self, job: ClaimedJob, error: str, final: bool = False,
                 seconds: float | None = None) -> Decided:
        """A failed attempt: retried after its backoff, or failed for good
        (`final`: whatever retries are left)."""
        retry = not final and job.retry_count < job.max_retries
        delay = self.config.retry_policy.delay(job.attempt) if retry else 0.0
        return Decided(FAILED, error, seconds, retry, delay, False)

    def _note(self, job: ClaimedJob, outcome: Decided, out: Outcomes) -> None:
        """Add a job's outcome to its batch's, and say what became of it
        (once: a rerun's kept outcomes were said the first time)."""
        out.add(job.id, outcome)
        if outcome.logged or outcome.kind == DONE:
            return
        seconds = outcome.seconds
        duration = None if seconds is None else round(seconds * 1000, 3)
        if outcome.kind == SNOOZED:
            logger.info("job %s (%s) attempt %d snoozed for %gs", job.id, job.job_type,
                        job.attempt, outcome.delay,
                        extra={"event": "job_snoozed", "job_id": str(job.id),
                               "job_type": job.job_type, "attempt": job.attempt,
                               "duration_ms": duration, "worker_id": self.worker_id,
                               "snooze_s": outcome.delay})
            return
        retry, delay, error = outcome.retry, outcome.delay, outcome.value
        logger.warning("job %s (%s) attempt %d failed%s: %s", job.id, job.job_type,
                       job.attempt, f", retry in {delay:.2f}s" if retry else "", error,
                       extra={"event": "job_failed", "job_id": str(job.id),
                              "job_type": job.job_type, "attempt": job.attempt,
                              "duration_ms": duration, "worker_id": self.worker_id,
                              "retry": retry, "retry_in_s": round(delay, 3) if retry else None,
                              "error": error})

    def _log_completed(self, jobs: list[ClaimedJob], out: Outcomes) -> None:
        """One DEBUG event per completed job of a committed batch (at INFO the
        worker logs a summary every `summary_interval` instead: a line per job
        would cost a no-op worker half its speed)."""
        by_id = {job.id: job for job in jobs}
        worker_id = self.worker_id
        for job_id, seconds in zip(out.done_ids, out.handler_times, strict=True):
            job = by_id[job_id]
            ms = round(seconds * 1000, 3)
            logger.debug("job %s (%s) attempt %d completed in %.1f ms", job.id, job.job_type,
                        job.attempt, ms,
                        extra={"event": "job_completed", "job_id": str(job.id),
                               "job_type": job.job_type, "attempt": job.attempt,
                               "duration_ms": ms, "worker_id": worker_id})

    async def _record(self, out: Outcomes, batch: BatchKind, jobs: list[ClaimedJob]
                      ) -> list[float]:
        """Write a batch's outcomes in its transaction; the successes' latencies."""
        raw, worker_id, taken = self.raw, self.worker_id, batch.taken
        latencies: list[float] = []
        if out.done_ids:
            latencies = await self._complete(out, taken, jobs)
        if out.failed_ids:
            rows = await queries["fail"].fetch(
                raw, ids=out.failed_ids, errors=out.errors, delays=out.delays,
                retry=out.retry, worker_id=worker_id, taken=taken)
            if len(rows) != len(out.failed_ids):
                raise LostOwnership
        if out.snoozed_ids:
            rows = await queries["snooze"].fetch(
                raw, ids=out.snoozed_ids, delays=out.snoozes, worker_id=worker_id, taken=taken)
            if len(rows) != len(out.snoozed_ids):
                raise LostOwnership
        unfinished = batch.to_hand_back(out.not_started)
        if unfinished:
            await queries["hand_back"].fetch(raw, ids=unfinished, worker_id=worker_id)
        return latencies

    async def _complete(self, out: Outcomes, taken: bool, jobs: list[ClaimedJob]) -> list[float]:
        """Record the successes (`complete`); a taken batch's by where `take`
        found their rows (`complete_taken`), and by id only those whose row
        moved since (a handler that updated its own job)."""
        raw, worker_id = self.raw, self.worker_id
        ids, results = out.done_ids, out.results
        latencies: list[float] = []
        tid_of = {job.id: job.tid for job in jobs} if taken else {}
        if tid_of and all(tid_of.get(job_id) is not None for job_id in ids):
            rows = await queries["complete_taken"].fetch(
                raw, ids=ids, results=results, tids=[tid_of[job_id] for job_id in ids],
                worker_id=worker_id)
            latencies = [row["latency"] for row in rows]
            if len(rows) == len(ids):
                return latencies
            found = {row["id"] for row in rows}
            moved = [i for i, job_id in enumerate(ids) if job_id not in found]
            ids, results = [ids[i] for i in moved], [results[i] for i in moved]
        rows = await queries["complete"].fetch(
            raw, ids=ids, results=results, worker_id=worker_id, taken=taken)
        if len(rows) != len(ids):
            raise LostOwnership
        return latencies + [row[0] for row in rows]


def _pending(session: Any) -> bool:
    """Has the handler left ORM changes unflushed? (Changed and deleted objects
    are in the identity map, which is empty for handlers that use no ORM
    objects: checked first, it keeps this cheap.)"""
    return bool(session.new or (session.identity_map and (session.dirty or session.deleted)))
