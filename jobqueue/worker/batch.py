"""A batch: the jobs one lane transaction runs, how they are held, and what
is recorded of them.

A batch holds its jobs one of two ways, and each way has its own rule for
jobs the worker will not finish (a shutdown, a lost transaction, a batch that
stopped early):

- **claimed** (`Claimed`): the claim committed before the batch ran, so the
  jobs show `processing` with this worker's id and stay its own after a
  rollback. Unfinished ones must be handed back (`hand_back`), or they wait
  for a rescue; running them again needs only a new transaction.
- **limited** (`Limited`): claimed, for queues that are paused or limited
  fleet-wide; admitted one claimer at a time.
- **alone** (`Alone`): claimed, one job that must run with nothing beside
  it (`alone.py`), admitted like a limited queue's.
- **taken** (`Taken`): locked by the batch's own transaction (`take`), never
  written until their outcome; unfinished ones need nothing, the end of the
  transaction releases them. Running them again means locking them again
  (`retake`), as they stand by then: another worker may have tried one.
  Nothing in the jobs shows the batch until it commits, so its transaction
  id comes back with it (`Started.xid`) for the lane to write down first.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Any, NamedTuple

from jobqueue.schema.locks import QUEUE_LOCK_CLASS
from jobqueue.schema.queries import queries
from jobqueue.worker.floors import Arms, Place
from jobqueue.worker.handler import ClaimedJob


class Started(NamedTuple):
    """A batch about to run: its open transaction, its jobs, and the
    transaction's id if nothing else names its jobs (a taken batch)."""

    tx: Any
    jobs: list[ClaimedJob]
    xid: int | None = None


class Claim(NamedTuple):
    """What a claim gave: the batch it started (None: it took no job), and
    where the next claim may start in each of its arms that took nothing
    (the jobs say it for the others; `floors.py`)."""

    started: Started | None
    places: list[Place]

    @property
    def rows(self) -> list[Any]:
        """Every row that says where an arm's next claim may start."""
        return self.places if self.started is None else [*self.started.jobs, *self.places]


#: A claim that was not sent (no waiting job known in the queue).
NOTHING = Claim(None, [])


def split(rows: list[Any]) -> tuple[list[Any], list[Place]]:
    """A claim's rows: its jobs', and after them (`claim`, `take`: no id) its
    empty arms' places."""
    k = len(rows)
    while k and rows[k - 1]["id"] is None:
        k -= 1
    return rows[:k], [Place(r["job_type"], r["priority"], r["floor"], r["floor_id"])
                      for r in rows[k:]]


class Claimed:
    """Jobs claimed (committed as `processing`) before the batch runs."""

    taken = False

    async def start(self, raw: Any, limit: int, worker_id: int, queue: str,
                    job_types: list[str], arms: Arms) -> Claim:
        """Claim up to `limit` due jobs of `queue`, then begin the batch's
        transaction. `arms`: the queue's (job type, priority) places and the
        lane's floor in each (`floors.py`; the limited and lone claims read
        from the front)."""
        rows, places = split(await self.claimed(raw, limit, worker_id, queue, job_types, arms))
        if not rows:
            return Claim(None, places)
        if len(rows) == 1:  # its transaction waits for its handler's first statement
            return Claim(Started(Deferred(raw), [ClaimedJob._make(rows[0])]), places)
        tx = raw.transaction()
        await tx.start()
        return Claim(Started(tx, list(map(ClaimedJob._make, rows))), places)

    async def claimed(self, raw: Any, limit: int, worker_id: int, queue: str,
                      job_types: list[str], arms: Arms) -> list[Any]:
        """The claim itself, committed (this kind's statement)."""
        return await self._claim(raw, limit=limit, worker_id=worker_id, queue=queue,
                                 job_types=job_types, **arms._asdict())

    async def _claim(self, raw: Any, **values: Any) -> list[Any]:
        if not values["priorities"]:
            return []  # no waiting job known in this queue
        return await queries["claim"].fetch(raw, **values)

    async def again(self, raw: Any, jobs: list[ClaimedJob]) -> Started | None:
        """A new transaction for jobs of a rolled-back batch: still ours, as they were."""
        tx = raw.transaction()
        await tx.start()
        return Started(tx, jobs)

    def to_hand_back(self, ids: list[uuid.UUID]) -> list[uuid.UUID]:
        """Jobs this worker will not finish go back to the queue explicitly."""
        return ids


class Limited(Claimed):
    """Jobs of a paused or limited queue: claimed like `Claimed`, but admitted
    one claimer at a time fleet-wide (`lock_queue`, then `claim_limited`, in
    one transaction), so that the count of running jobs and the rate
    window's count each claimer reads include every claim before it. Only
    ever claimed: a limit counts `processing` jobs, and a quick batch's jobs
    never show that."""

    async def _claim(self, raw: Any, **values: Any) -> list[Any]:
        async with raw.transaction():
            await queries["lock_queue"].execute(raw, lock_class=QUEUE_LOCK_CLASS,
                                                queue=values["queue"])
            return await queries["claim_limited"].fetch(raw, **values)


class Alone(Limited):
    """One job that must run alone (`alone.py`): claimed like a limited
    queue's (`lock_queue`, then `claim_alone`), so a queue's limits hold for
    it too."""

    async def _claim(self, raw: Any, **values: Any) -> list[Any]:
        async with raw.transaction():
            await queries["lock_queue"].execute(raw, lock_class=QUEUE_LOCK_CLASS,
                                                queue=values["queue"])
            return await queries["claim_alone"].fetch(raw, **values)


class Taken:
    """Jobs locked inside the batch's own transaction (a quick batch)."""

    taken = True

    async def start(self, raw: Any, limit: int, worker_id: int, queue: str,
                    job_types: list[str], arms: Arms) -> Claim:
        """Begin the batch's transaction and lock up to `limit` due jobs of `queue` in it."""
        if not arms.priorities:
            return NOTHING  # no waiting job known in this queue
        tx, rows, places = await lock(raw, "take", limit=limit, queue=queue,
                                      job_types=job_types, **arms._asdict())
        if tx is None:
            return Claim(None, places)
        return Claim(Started(tx, _jobs(rows), rows[0]["xid"]), places)

    async def again(self, raw: Any, jobs: list[ClaimedJob]) -> Started | None:
        """The rollback released them: lock again those no other worker took
        meanwhile, as they stand now, in their first order (None: none left)."""
        tx, rows, _ = await lock(raw, "retake", ids=[j.id for j in jobs])
        if tx is None:
            return None
        order = {j.id: n for n, j in enumerate(jobs)}
        return Started(tx, sorted(_jobs(rows), key=lambda j: order[j.id]), rows[0]["xid"])

    def to_hand_back(self, ids: list[uuid.UUID]) -> list[uuid.UUID]:
        """Nothing: the end of their transaction releases them untouched."""
        return []


CLAIMED, LIMITED, ALONE, TAKEN = Claimed(), Limited(), Alone(), Taken()
BatchKind = Claimed | Taken


class Kinds(NamedTuple):
    """The kinds of batch an executor runs, by what the lane asks for: a
    batch as planned (taken or claimed), from a limited queue, a job alone."""

    claimed: BatchKind
    taken: BatchKind
    limited: BatchKind
    alone: BatchKind


#: An async lane's: its batch runs in a transaction on the lane's connection.
LANE_KINDS = Kinds(CLAIMED, TAKEN, LIMITED, ALONE)


def _jobs(rows: list[Any]) -> list[ClaimedJob]:
    """A taken batch's jobs from `take`/`retake` rows (their last column, the
    transaction's id, is the batch's)."""
    width = len(ClaimedJob._fields)
    return [ClaimedJob(*row[:width]) for row in rows]


async def lock(raw: Any, query: str, **values: Any
               ) -> tuple[Any | None, list[Any], list[Place]]:
    """Begin a transaction and lock jobs in it with `query` (take, retake):
    the transaction (None, rolled back, when there were none), the jobs'
    rows, and the empty arms' places (`split`)."""
    tx = raw.transaction()
    await tx.start()
    try:
        rows, places = split(await queries[query].fetch(raw, **values))
    except BaseException:
        await rollback(tx)
        raise
    if not rows:
        await tx.rollback()
        return None, rows, places
    return tx, rows, places


class Deferred:
    """The transaction of a batch of one claimed job, begun only if something
    needs one: the handler's first statement begins it (`handler.py`). A job
    that never touches the database is then recorded by one statement in
    autocommit (its `complete`, `fail`, `snooze` or `hand_back`: a batch of
    one has exactly one outcome), so a lone job costs its claim and that
    statement: two round trips instead of four. (BEGIN, COMMIT and ROLLBACK
    are sent as asyncpg's own transactions send them, as simple queries.)"""

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    async def commit(self) -> None:
        if self.raw.is_in_transaction():
            await self.raw.execute("COMMIT")

    async def rollback(self) -> None:
        if self.raw.is_in_transaction():
            await self.raw.execute("ROLLBACK")


async def rollback(tx: Any) -> None:
    """Roll back if still open; on a dead connection there is nothing to undo."""
    with contextlib.suppress(Exception):
        await tx.rollback()
