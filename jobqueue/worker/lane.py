"""A lane: one connection that takes a batch of jobs, runs it, commits it, and again.

A batch is one transaction and one commit, whatever its size; one `complete`
and one `fail` statement record every outcome. Handlers write through the
lane's session, straight into the batch (`handler.py`): *plain*, with
no savepoint, until a job of their type fails after touching the database.
That failure cannot be undone alone, so the batch rolls back and runs again
with a savepoint per job (`Lane._rerun_isolated`: what did not write keeps its
outcome, what wrote runs again), and the type keeps its savepoints from then
on. A batch ends before it would open more savepoints than PostgreSQL caches
per transaction (64).

Two ways to take a batch, chosen per batch from how long the lane's recent
jobs took (`Lane.plan`, which returns a `Plan`); `batch.py` has each way's
rule for jobs the lane will not finish:

- **taken**, a *quick batch* (jobs faster than `quick_batch`, 50 ms by
  default): lock as many due jobs as should finish within `quick_batch` (up
  to `batch_size`) inside
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

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
    Rerun,
    Started,
    decided_of,
    rollback,
)
from jobqueue.worker.book import QueueBook
from jobqueue.worker.config import WorkerConfig
from jobqueue.worker.doorbell import Doorbell
from jobqueue.worker.floors import NO_ARMS, Arms, Floors
from jobqueue.worker.handler import (
    IN_HANDLER,
    SAVEPOINT_LIMIT,
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
from jobqueue.worker.stats import WorkerStats

logger = logging.getLogger("jobqueue.worker")


class Plan(NamedTuple):
    """How a lane takes its next batch (`Lane.plan`)."""

    #: True: a quick batch, taken (locked) inside its own transaction;
    #: False: claimed (committed as `processing`) before it runs.
    take: bool
    #: Most jobs in it.
    limit: int


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


#: Weight of the newest batch in a lane's running estimate of a job's run time.
_PACE_WEIGHT = 0.3


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
        #: Recent seconds a job takes to run (its handler and savepoint; the
        #: batch's own statements are left out, or a lone job's commit would
        #: count as if each job of a full batch paid it); None until a batch ran.
        self.per_job: float | None = None
        #: Recent savepoints a job opens (0 for jobs that never touch the
        #: database), and the most one job of each type has opened (at most
        #: SAVEPOINT_LIMIT): they size batches so that none opens more than
        #: SAVEPOINT_LIMIT.
        self.savepoints_per_job = 0.0
        self.savepoint_peak: dict[str, int] = {}
        #: The jobs of the batch running now, and those of them cancelled
        #: before they started; what stops the running handler.
        self.batch: list[ClaimedJob] = []
        self.cancels: set[uuid.UUID] = set()
        #: A claim is on its way (`_claim`), and the cancels heard meanwhile
        #: for jobs this lane does not hold yet: the claim may bring them.
        self.claiming = False
        self.heard: set[uuid.UUID] = set()
        self.stopper: Stopper | None = None
        #: The last claim saw no other job due where it took (`plan`).
        self.lone = True
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
        """How to take the next batch: taken or claimed, how many jobs at most.

        Jobs that run faster than `quick_batch` are taken, in quick batches
        sized to last about that long (at most `batch_size`); slower ones are claimed
        one at a time, so `processing` means running and no transaction stays
        open across many slow jobs. A lane that has not run anything yet
        claims one job to learn the pace; so does a lane whose last claim saw
        no other job due (`lone`): what it finds next is most likely a job
        that arrived alone, and a claimed batch of one costs two round trips
        (its claim, then its outcome in autocommit, `batch.Deferred`) where a
        quick batch costs five. `quick_batch` 0: claimed batches of
        up to `batch_size`, never taken. Jobs that write are at most
        SAVEPOINT_LIMIT to a batch, one savepoint each."""
        config = self.config
        limit = config.batch_size
        if self.savepoints_per_job > 0:
            limit = min(limit, max(1, int(SAVEPOINT_LIMIT / self.savepoints_per_job)))
        if config.quick_batch == 0:
            return Plan(False, limit)
        if self.lone or self.per_job is None or self.per_job > config.quick_batch:
            return Plan(False, 1)
        if self.per_job > 0:
            limit = min(limit, int(config.quick_batch / self.per_job))
        return Plan(True, max(1, limit))

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
                    self.lone = started.jobs[-1].floor_id is None
                    if not self.lone:  # more are due than it took: wake a lane to help
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

    def _full(self, taken: bool, started: float, savepoints: int, job: ClaimedJob) -> bool:
        """Must the batch stop before `job`? A quick batch that outruns
        quick_batch (slow jobs after fast ones) stops early: its untouched jobs
        are released at the commit, and the lane's pace now says to claim them.
        A batch that has opened savepoints stops before a job that could take
        it past SAVEPOINT_LIMIT (judged by the most its type has opened, and
        at least one)."""
        if savepoints and savepoints + max(1, self.savepoint_peak.get(job.job_type, 0)
                                           ) > SAVEPOINT_LIMIT:
            return True
        return taken and time.perf_counter() - started > self.config.quick_batch

    def _pace(self, seconds: float, jobs: int, savepoints: int) -> None:
        """Fold a batch's run time and savepoints into the lane's estimates."""
        per_job = seconds / jobs
        self.per_job = per_job if self.per_job is None else (
            _PACE_WEIGHT * per_job + (1 - _PACE_WEIGHT) * self.per_job)
        # At most one a job: a job that opens many of its own (it overflows
        # alone) must not shrink the batches of the jobs after it.
        self.savepoints_per_job = (_PACE_WEIGHT * min(1.0, savepoints / jobs)
                                   + (1 - _PACE_WEIGHT) * self.savepoints_per_job)

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
                         batch: BatchKind, isolated: bool = False,
                         decided: dict[uuid.UUID, Decided] | None = None) -> None:
        """`_run_tx`; a quick batch's jobs that it did not record (its
        transaction rolled back, or it stopped early) wait again where they
        were, behind this lane's floor, which goes back to them."""
        if not batch.taken:
            await self._run_tx(conn, session, started, batch, isolated, decided)
            return
        left: list[uuid.UUID] | None = None
        try:
            left = await self._run_tx(conn, session, started, batch, isolated, decided)
        finally:
            if left is None:
                self.life.floors.released(self.number, self.queue, started.jobs)
            elif left:
                unrecorded = set(left)
                self.life.floors.released(self.number, self.queue,
                                          [job for job in started.jobs if job.id in unrecorded])

    async def _run_tx(self, conn: AsyncConnection, session: AsyncSession, started: Started,
                      batch: BatchKind, isolated: bool = False,
                      decided: dict[uuid.UUID, Decided] | None = None
                      ) -> list[uuid.UUID] | None:
        """Run a batch in its open transaction; one commit records every outcome.
        `batch`: how its jobs are held (taken by this transaction, or claimed;
        a taken batch is written down first, `record_batch`).
        `isolated`: every job in a savepoint of its own (else only the job
        types that need one). `decided`: outcomes recorded without running
        those jobs again (a rerun's). Returns the jobs it committed without
        recording them, not started (None: it rolled back; a rerun records
        its own)."""
        life = self.life
        outcomes = Outcomes()
        decided = decided or {}
        tx, jobs = started.tx, started.jobs
        try:
            if started.xid is not None:
                await life.record_batch(self.number, started.xid, [job.id for job in jobs])
            await self._run_jobs(conn, session, jobs, batch, isolated, decided, outcomes,
                                 begun=not isinstance(tx, Deferred))
            latencies = await self._record(outcomes, batch, jobs)
            await tx.commit()
        except Rerun as rerun:
            await rollback(tx)
            await self._rerun_isolated(conn, session, jobs, batch, rerun)
            return None
        except LostOwnership:
            await rollback(tx)
            logger.warning("batch of %d rolled back: another worker took some of its jobs",
                           len(jobs), extra={"event": "batch_lost", "jobs": len(jobs),
                                             "worker_id": self.worker_id})
            await self._hand_back(batch, jobs)
            return None
        except Exception as exc:
            await rollback(tx)
            if life.abandon.is_set():
                raise
            if not is_connection_error(exc):
                await self._after_batch_error(conn, session, jobs, batch, exc, decided)
                return None
            logger.error("lane %d: connection lost mid-batch; %d job(s) go back to the queue",
                         self.number, len(jobs),
                         extra={"event": "batch_connection_lost", "lane": self.number,
                                "jobs": len(jobs), "worker_id": self.worker_id,
                                "error": one_line(exc)})
            await self._hand_back(batch, jobs)
            raise
        life.stats.count_batch(outcomes, latencies)
        if outcomes.done_ids and logger.isEnabledFor(logging.DEBUG):
            self._log_completed(jobs, outcomes)  # committed: now they are done
        return outcomes.not_started

    async def _hand_back(self, batch: BatchKind, jobs: list[ClaimedJob]) -> None:
        """The batch rolled back and will not run again here: its jobs go back
        to the queue as `batch`'s rule says."""
        ids = batch.to_hand_back([job.id for job in jobs])
        if ids:
            await self.life.hand_back(ids)

    async def _run_jobs(self, conn: AsyncConnection, session: AsyncSession,
                        jobs: list[ClaimedJob], batch: BatchKind, isolated: bool,
                        decided: dict[uuid.UUID, Decided], out: Outcomes,
                        begun: bool = True) -> None:
        """The batch's handlers, one after another, until done or `_full`;
        the `decided` jobs' outcomes first, without running them. Not
        `begun`: the first handler statement begins the transaction."""
        always = isolated or self.config.savepoints == "always"
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
            if stop.is_set() or (ran and self._full(taken, started, state.savepoints, job)):
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
            used = min(state.savepoints - opened, SAVEPOINT_LIMIT)
            if used > self.savepoint_peak.get(job.job_type, 0):
                self.savepoint_peak[job.job_type] = used
            ran += 1
        if ran:
            self._pace(time.perf_counter() - started, ran, state.savepoints)

    async def _after_batch_error(self, conn: AsyncConnection, session: AsyncSession,
                                 jobs: list[ClaimedJob], batch: BatchKind, exc: Exception,
                                 decided: dict[uuid.UUID, Decided]) -> None:
        """The batch could not be recorded or committed (a deferred constraint
        a handler broke, say): it rolled back whole. Run its jobs again one per
        transaction, so the culprit fails alone; a lone job that still cannot
        commit is failed without its writes, its attempt counted."""
        if len(jobs) > 1:
            logger.warning("batch of %d could not commit (%s); running its jobs one by one",
                           len(jobs), one_line(exc),
                           extra={"event": "batch_split", "jobs": len(jobs),
                                  "worker_id": self.worker_id, "error": one_line(exc)})
            for job in jobs:
                again = await batch.again(self.raw, [job])
                if again is not None:
                    await self._run_batch(conn, session, again, batch,
                                          isolated=True, decided=decided)
            return
        again = await batch.again(self.raw, jobs)
        if again is None:
            return
        tx, [job] = again.tx, again.jobs
        out = Outcomes()
        retry = job.retry_count < job.max_retries
        delay = self.config.retry_policy.delay(job.attempt) if retry else 0.0
        out.failure(job.id, error_text(exc), retry=retry, delay=delay)
        try:
            await self._record(out, batch, [job])
            await tx.commit()
        except BaseException:
            await rollback(tx)
            raise
        self.life.stats.count_batch(out, [])
        logger.warning("job %s (%s) attempt %d failed at commit: %s", job.id, job.job_type,
                       job.attempt, error_text(exc),
                       extra={"event": "job_failed", "job_id": str(job.id),
                              "job_type": job.job_type, "attempt": job.attempt,
                              "worker_id": self.worker_id, "retry": retry,
                              "error": error_text(exc)})

    async def _rerun_isolated(self, conn: AsyncConnection, session: AsyncSession,
                              jobs: list[ClaimedJob], batch: BatchKind, rerun: Rerun) -> None:
        """A plain job (the culprit) failed after touching the database, or
        rolled its session back after writing: the batch has rolled back, and
        runs again with every job in a savepoint of its own. Jobs already
        decided are recorded as they were (failures, and successes that never
        touched the database); the jobs before the culprit that wrote run a
        second time (their writes still commit once; what they did outside the
        database happens twice). The culprit's type already runs isolated in
        this worker from now on (`_run_one`), so this happens once per type."""
        culprit = rerun.job
        self.life.stats.rerun += rerun.again
        self.savepoints_per_job = max(self.savepoints_per_job, 1.0)  # claim batches of 64
        logger.warning("job %s (%s) %s after touching the database, in a batch run without "
                       "savepoints: the batch rolled back and runs again, each job in a "
                       "savepoint (%d job(s) that ran already run a second time, %d kept "
                       "as they were); %s jobs run in savepoints from now on",
                       culprit.id, culprit.job_type,
                       _what_happened(rerun.outcome), rerun.again,
                       len(rerun.decided), culprit.job_type,
                       extra={"event": "batch_rerun", "job_id": str(culprit.id),
                              "job_type": culprit.job_type, "jobs": len(jobs),
                              "rerun": rerun.again, "worker_id": self.worker_id})
        again = await batch.again(self.raw, jobs)  # taken ones: those still free, as they are
        if again is not None:
            await self._run_batch(conn, session, again, batch, isolated=True,
                                  decided=rerun.decided)

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


def _what_happened(outcome: Decided | None) -> str:
    """A rerun's culprit, in words."""
    if outcome is None:
        return "rolled its session back"
    return "snoozed" if outcome.kind == SNOOZED else "failed"


def _pending(session: Any) -> bool:
    """Has the handler left ORM changes unflushed? (Changed and deleted objects
    are in the identity map, which is empty for handlers that use no ORM
    objects: checked first, it keeps this cheap.)"""
    return bool(session.new or (session.identity_map and (session.dirty or session.deleted)))
