"""A lane: one connection that takes batches of due jobs from the queues, in
turn, and hands each to its executor; what the lane decides is where and how
much to take, and when to sleep.

The executor is what runs a batch, given to the lane (composition, not a
subclass): `executor.AsyncExecutor` runs async handlers in one transaction
on the lane's own connection; `threads.ThreadExecutor` hands sync handlers
to a pool of threads and goes on claiming while they run. Each says which
kinds of batch it runs (`batch.Kinds`) and how many jobs it wants next
(`plan`).

A batch is taken or claimed, as the executor plans it (`pacing.py`):

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
"""

from __future__ import annotations

import uuid
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from jobqueue.schema.queries import queries
from jobqueue.worker.batch import BatchKind, Claim, Kinds, Started
from jobqueue.worker.config import WorkerConfig
from jobqueue.worker.floors import NO_ARMS, Arms
from jobqueue.worker.handler import ClaimedJob
from jobqueue.worker.life import Life
from jobqueue.worker.pacing import Plan


class Executor(Protocol):
    """What runs the batches a lane takes."""

    #: The kinds of batch it runs.
    kinds: Kinds

    def plan(self, lone: bool) -> Plan:
        """How to take the next batch; `lone`: the last claim saw no other job due."""

    def opened(self, conn: AsyncConnection, raw: Any) -> AbstractAsyncContextManager[None]:
        """What it needs of the lane's connection, for as long as the lane has it."""

    def ready(self) -> bool:
        """Can it take a batch now?"""

    async def wait_ready(self) -> None:
        """Until it can take a batch (or the worker stops)."""

    async def run(self, started: Started, batch: BatchKind, queue: str,
                  cancels: set[uuid.UUID]) -> None:
        """Run a batch the lane took from `queue`; `cancels`: its jobs
        cancelled before they start (the lane adds to it while it runs)."""

    def interrupt(self, job_id: uuid.UUID, reason: str) -> bool:
        """Stop `job_id` if it is running here (True)."""

    def cancelled(self) -> set[uuid.UUID]:
        """The jobs running here, past the lane's batch, that were cancelled."""

    async def settle_one(self) -> bool:
        """A burst run found nothing due: wait for a running job that may
        yet be retried at once (False: none runs beside the lane)."""

    async def finish(self) -> None:
        """The lane stops taking: until what still runs has ended."""

    def cut(self) -> None:
        """Abandon what still runs (its transactions roll back)."""


class Lane:
    """One of a worker's `concurrency` lanes (and the sync types' one)."""

    def __init__(self, config: WorkerConfig, life: Life, engine: AsyncEngine,
                 number: int, executor: Executor, serves: tuple[str, ...] | None = None
                 ) -> None:
        self.config = config
        self.life = life
        self.engine = engine
        self.number = number
        self.executor = executor
        #: The queues this lane takes from (None: every queue with waiting jobs).
        self.serves = serves
        #: Where the next batch's turn among the queues starts: lanes start
        #: apart, so two lanes do not take from the same queue in lockstep.
        self.turn = number
        #: The queues the last empty round tried.
        self.tried: set[str] = set()
        #: Lanes of one kind run the same job types (`doorbell.py`).
        self.kind = tuple(life.job_types)
        life.bell.join(self.kind)
        self.worker_id = life.worker_id
        self.raw: Any = None  # the asyncpg connection, to cut it off when abandoning
        #: The jobs of the batch running now, and those of them cancelled
        #: before they started.
        self.batch: list[ClaimedJob] = []
        self.cancels: set[uuid.UUID] = set()
        #: A claim is on its way (`_claim`), and the cancels heard meanwhile
        #: for jobs this lane does not hold yet: the claim may bring them.
        self.claiming = False
        self.heard: set[uuid.UUID] = set()
        #: The last claim saw no other job due where it took: what comes
        #: next most likely arrives alone (`pacing.py`).
        self.lone = True

    async def run(self) -> None:
        """Work until the worker stops, then let what still runs end. A lost
        connection is not reopened here: a claim whose reply was lost leaves
        jobs this lane cannot name, so the error ends the worker's life; it
        starts over under a new id, and the old id's jobs are rescued like a
        dead worker's. Ended any other way than a stop (abandoned, a lost
        connection), what still runs is cut off."""
        try:
            async with self.engine.connect() as conn:
                self.raw = (await conn.get_raw_connection()).driver_connection
                async with self.executor.opened(conn, self.raw):
                    await self._loop()
            await self.executor.finish()
        except BaseException:
            self.executor.cut()
            raise
        finally:
            self.raw = None

    @property
    def stopping(self) -> bool:
        return self.life.stop.is_set()

    def interrupt(self, job_id: uuid.UUID, reason: str) -> bool:
        """Cancel job `job_id` if this lane holds it (True): its handler is
        stopped if it is running, and the batch keeps the cancel whatever
        becomes of the job (`executor.py`: not started, done, to be retried)."""
        stopped = self.executor.interrupt(job_id, reason)
        if any(job.id == job_id for job in self.batch):
            self.cancels.add(job_id)
            return True
        if stopped:
            return True
        if self.claiming:
            self.heard.add(job_id)  # `_claim` looks at it when the claim is back
        return False

    def cancels_held(self) -> set[uuid.UUID]:
        """The jobs this lane holds that were cancelled (a worker abandoning
        them sends the cancels again once it has handed them back)."""
        return self.cancels | self.executor.cancelled()

    def cut(self) -> None:
        """Close the connection at once (abandoning: its transaction rolls
        back), and abandon what the executor still runs."""
        if self.raw is not None and not self.raw.is_closed():
            self.raw.terminate()
        self.executor.cut()

    def plan(self) -> Plan:
        """How to take the next batch (the executor's plan)."""
        return self.executor.plan(self.lone)

    async def _loop(self) -> None:
        bell = self.life.bell
        while not self.stopping:
            bell.clear(self.serves, self.kind)
            if not self.executor.ready():
                await self.executor.wait_ready()
            elif not await self._next_batch() and not await self._wait_for_work():
                return

    async def _next_batch(self) -> bool:
        """Take and run one batch; False when nothing was due.

        The queues take turns: the batch comes from the first of them, from
        this lane's turn on, that has a due job it may take, and the next turn
        starts after it. So every queue with due jobs gets a batch within one
        round, whatever floods another."""
        gate = self.life.alone
        if gate.wanted and await self._run_alone():
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
                claim = await self._claim(batch, limit, queue,
                                          floors.arms(self.number, queue, self.life.job_types))
                floors.advance(self.number, queue, claim.rows)  # empty arms too
                started = claim.started
                if started is not None:
                    self.lone = floors.drained(queue, self.life.job_types, claim.rows)
                    if not self.lone:  # more are due than it took: wake a lane to help
                        self.life.bell.ring(queue)
                    self.turn = (self.turn + step + 1) % len(queues)
                    await self._run_held(started, batch, queue)
                    return True
        self.tried = set(queues)
        if gate.look(self.config.poll_interval):  # nothing else to do: any lone jobs?
            return await self._run_alone()
        return False

    def batch_kind(self, queue: str, take: bool) -> BatchKind:
        """How a batch from `queue` holds its jobs: claimed one claimer at a
        time if the queue is limited, else taken or claimed as planned."""
        kinds = self.executor.kinds
        return kinds.limited if self.life.book.limited(queue) else (
            kinds.taken if take else kinds.claimed)

    async def _claim(self, kind: BatchKind, limit: int, queue: str, arms: Arms) -> Claim:
        """Take or claim a batch from `queue` (`kind.start`), and hold its jobs
        from the moment the reply is back: a cancel for one of them from then
        on stops it (`interrupt`). A cancel can also overtake the reply: the
        job was locked or `processing` when it was cancelled, so its
        notification went out, and the event loop may deliver it before
        this task runs again. Those heard while the claim was on its way are
        kept, and a job of the batch among them fails `cancelled` unstarted."""
        self.claiming = True
        try:
            claim = await kind.start(self.raw, limit, self.worker_id, queue,
                                     self.life.job_types, arms)
        finally:
            self.claiming = False
            heard, self.heard = self.heard, set()
        started = claim.started
        if started is not None:
            self.batch = started.jobs
            self.cancels = {job.id for job in started.jobs if job.id in heard}
        return claim

    async def _run_held(self, started: Started, batch: BatchKind, queue: str) -> None:
        try:
            await self.executor.run(started, batch, queue, self.cancels)
        finally:
            self.batch = []
            self.cancels = set()
            if self.config.burst:
                # A sibling lane that found this batch's jobs due but locked
                # waits to look again; once they are done it may be the end
                # of the run, so it should not sleep out its poll interval.
                self.life.bell.ring()

    async def _run_alone(self) -> bool:
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
                    kind = self.executor.kinds.alone
                    started = (await self._claim(kind, 1, queue, NO_ARMS)).started
                    if started is not None:
                        await self._run_held(started, kind, queue)
                        ran = True
                        break
                else:
                    return ran  # due, but not ours to take now (a limit, another worker)
        return ran

    async def _wait_for_work(self) -> bool:
        """Sleep until a job may be due. False when a burst run is done."""
        book = self.life.book
        await book.look(self.raw, self.life.floors)
        if self.serves is None and any(due <= 0 for queue, due in book.waiting.items()
                                       if queue not in self.tried):
            return True  # a queue this lane has not tried yet: try it at once
        if self.config.burst:
            if await self.executor.settle_one():
                return True
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
