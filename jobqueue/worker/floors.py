"""Where each lane's next claim starts reading, per queue and priority.

A claimed job leaves its entry in idx_jobs_pickable behind: the claim's
update (or the batch's completion) made a new row version that the
partial index does not hold, and the old entry goes only when vacuum
removes the version it points to. Vacuum may remove it only once no
transaction can still see it, so one long transaction anywhere in the
cluster (an idle session holding an xid, a REPEATABLE READ report) keeps
every entry of every job finished since. A claim that reads the index
from the front steps over each of them and visits its heap row to learn
that it is dead: one buffer per finished job, so the claims slow down as
the transaction ages (notebooks/lessons/08_vacuum_horizon.ipynb shows it).

So a lane claims from a *floor*: for each (queue, priority) it takes
from, the run_at from which the jobs it has not taken yet begin
(`queries.sql: claim, take`, which say where the next claim may start).
The claims read only the range past the floor, whatever lies dead before
it. What a floor must never do is hide a job that is waiting; jobs that
can arrive behind one:

- one enqueued in a transaction that began before the jobs the lane took
  since (its run_at defaults to its transaction's start): the insert
  trigger announces each statement's (queue, priority, earliest run_at)
  at commit, and `lower` moves the floors back to it;
- one made waiting and due again by an UPDATE (`hand_back`, a retry from
  the API, a new queue or priority, one written by hand): a row trigger
  announces it the same way;
- one of this lane's own quick batch released without being recorded
  (the batch stopped early, or rolled back): the lane lowers its own
  floor (`lower`, one lane);
- one locked by someone else when the claim passed it (another lane, a
  caller of `wait()`, another worker's batch): never behind, because the
  floor a claim returns stops at the first job it did not take that is
  still waiting, locked or not;
- anything that announced nothing (written with triggers off, as by
  `session_replication_role = replica`; a notification lost with a
  listening connection): found by the worker's look from the front
  (`waiting_queues`), when a life begins and once every
  `DISCOVER_INTERVAL` after, which lowers every floor past a waiting job.

A (queue, priority) pair the worker has not seen has no floor: its first
claim reads it from the start. Floors belong to one life of a worker
(one worker id): a new life starts from the front.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple, Protocol

logger = logging.getLogger("jobqueue.worker")

#: Seconds between two looks from the front of the index (`waiting_queues`),
#: the safety net for waiting jobs that announced nothing.
DISCOVER_INTERVAL = 60.0

#: How the insert and update triggers say where jobs wait (migration 0007):
#: ``due:<priority>:<epoch seconds of the earliest run_at>:<queue>``.
DUE_PREFIX = "due:"

#: The least id: a floor at a time alone, before every job due then.
NIL = uuid.UUID(int=0)

#: A floor: the (run_at, id) from which a claim reads, in the index's order.
Floor = tuple[dt.datetime, uuid.UUID]

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
#: Sorts after every floor: a place the worker knows nothing of.
_UNKNOWN: Floor = (dt.datetime.max.replace(tzinfo=dt.UTC), NIL)


class Arms(NamedTuple):
    """A claim's arms, in the order it reads them: one per (job type,
    priority) of its queue, priorities highest first and within one the
    lane's types in turn, with the lane's floor in each (None: from the
    start)."""

    arm_types: list[str]
    priorities: list[int]
    floors: list[dt.datetime | None]
    floor_ids: list[uuid.UUID | None]


#: The arms of a claim that reads from the front of its own index (a
#: limited queue's, a lone job's).
NO_ARMS = Arms([], [], [], [])

#: Where a floor is kept: (queue, job type, priority).
Key = tuple[str, str, int]


class Place(NamedTuple):
    """Where an arm of a claim that took nothing there says the lane's next
    claim may start (a row of `claim` or `take` with no job): without it, a
    type with nothing waiting keeps no floor, and every claim reads its
    range from the front."""

    job_type: str
    priority: int
    floor: dt.datetime | None
    floor_id: uuid.UUID | None


class Placed(Protocol):
    """A job as the floors need it: where it waits."""

    @property
    def id(self) -> uuid.UUID: ...

    @property
    def job_type(self) -> str: ...

    @property
    def priority(self) -> int: ...

    @property
    def run_at(self) -> dt.datetime: ...


class Floors:
    """The floors of one worker's lanes during one life, and the (queue,
    priority) pairs it knows have waiting jobs.

    A floor is kept per job type as well: the claims read idx_jobs_pickable,
    whose entries go (queue, job_type, priority, run_at, id), one range per
    type, so that a worker never steps over the jobs of types it has no
    handler for. What announces jobs (`heard`, `lower` without a type)
    names no type, and lowers the floors of every type at its place."""

    def __init__(self, job_types: Iterable[str] = ()) -> None:
        #: Queue -> the priorities it has had waiting jobs at.
        self.groups: dict[str, set[int]] = {}
        #: Every type this worker has a handler for: what `lowest` looks for.
        self.job_types = list(job_types)
        #: Lane number -> key -> floor. No entry: from the start.
        self._lanes: dict[int, dict[Key, Floor]] = {}
        #: Lane number -> the keys where the lane has taken no job in this
        #: life, only read (their floors come from arms that took nothing,
        #: `Place`): `arms` orders them as places without a floor, by where
        #: the last look found a job, after those it took from.
        self._empty: dict[int, set[Key]] = {}
        #: Lane number -> the types it claims (its latest `arms`).
        self._serves: dict[int, list[str]] = {}
        #: Key -> the first waiting job the last look found there.
        self._heads: dict[Key, Floor] = {}
        #: When the last look from the front began (monotonic seconds);
        #: None: not yet in this life.
        self.discovered_at: float | None = None
        #: For each lane's claim in progress, the lowest place announced in
        #: each (queue, priority) since it began: what `advance` must not pass.
        self._heard: dict[int, dict[tuple[str, int], Floor]] = {}

    def learn(self, queue: str, priority: int) -> None:
        self.groups.setdefault(queue, set()).add(priority)

    def arms(self, lane: int, queue: str, job_types: list[str]) -> Arms:
        """The claim's arms for `queue`: for each of its priorities, highest
        first, one arm per type of `job_types` (the lane's), the type whose
        next job has waited longest first: by the lane's floor there, or,
        in a place it has none, by where the last look found the first job
        (`seen`; neither: last, in the order given: it most likely has
        nothing waiting). A claim fills
        its batch from its first arms, so this keeps due order across types
        as far as the worker knows it, and a type with a backlog cannot hold
        back another one's older jobs. Marks when the claim began, for
        `advance`."""
        self._serves[lane] = job_types
        own = self._lanes.get(lane, {})
        empty = self._empty.get(lane, set())
        self._heard[lane] = {}
        arms = Arms([], [], [], [])

        def waited(place: tuple[Key, Floor | None]) -> Floor:
            key, floor = place
            return (floor if floor is not None and key not in empty
                    else self._heads.get(key, _UNKNOWN))

        for p in sorted(self.groups.get(queue, ()), reverse=True):
            places = [((queue, t, p), own.get((queue, t, p))) for t in job_types]
            for key, floor in sorted(places, key=waited):
                arms.arm_types.append(key[1])
                arms.priorities.append(p)
                arms.floors.append(floor and floor[0])
                arms.floor_ids.append(floor and floor[1])
        return arms

    def advance(self, lane: int, queue: str, rows: Iterable[Any]) -> None:
        """A claim of this lane returned `rows` (jobs and `Place`s, with
        `job_type`, `priority` and the `floor` the statement worked out for
        their arm): its next claims start there — or lower, where an
        announcement came while the claim ran (its job committed after the
        claim's snapshot was taken)."""
        own = self._lanes.setdefault(lane, {})
        empty = self._empty.setdefault(lane, set())
        heard = self._heard.pop(lane, {})
        for row in rows:
            if row.floor is None:
                continue
            key = (queue, row.job_type, row.priority)
            if not isinstance(row, Place):
                empty.discard(key)
            elif key not in own:
                empty.add(key)
            floor = (row.floor, row.floor_id or NIL)
            low = heard.get((queue, row.priority))
            own[key] = floor if low is None else min(floor, low)

    def lower(self, queue: str, priority: int, at: dt.datetime, job_id: uuid.UUID = NIL,
              lane: int | None = None, job_type: str | None = None) -> None:
        """A job waits in (`queue`, `priority`) from (`at`, `job_id`) on: no
        floor of `lane` (None: of every lane) in that place may stay past
        it, of its `job_type` (None: of every type)."""
        self.learn(queue, priority)
        lanes = self._lanes.values() if lane is None else [self._lanes.get(lane, {})]
        low = (at, job_id)
        if lane is None:
            for heard in self._heard.values():  # claims on their way: see `advance`
                place = (queue, priority)
                if place not in heard or heard[place] > low:
                    heard[place] = low
        for own in lanes:
            for key, floor in own.items():
                if (key[0] == queue and key[2] == priority and floor > low
                        and (job_type is None or key[1] == job_type)):
                    own[key] = low

    def released(self, lane: int, queue: str, jobs: Iterable[Placed]) -> None:
        """Jobs of this lane's quick batch went back untouched (its
        transaction ended without recording them): they wait where they were."""
        for job in jobs:
            self.lower(queue, job.priority, job.run_at, job.id, lane, job.job_type)

    def heard(self, payload: str) -> tuple[str, dt.datetime] | None:
        """Apply a `due:` announcement: the queue it names and when its
        earliest job is due (None: not one, or not readable)."""
        if not payload.startswith(DUE_PREFIX):
            return None
        try:
            priority, epoch, queue = payload[len(DUE_PREFIX):].split(":", 2)
            at = _from_epoch(epoch)
            self.lower(queue, int(priority), at)
        except (ValueError, OverflowError):
            logger.warning("ignored an unreadable notification %r", payload,
                           extra={"event": "notification_unreadable"})
            return None
        return queue, at

    def lowest(self) -> dict[str, list[Any]]:
        """Every known place of this worker's types and the lowest floor the
        lanes claiming that type have there (None if one has none): where
        `waiting_after` looks (its values)."""
        out: dict[str, list[Any]] = {"queues": [], "arm_types": [], "priorities": [],
                                     "floors": [], "floor_ids": []}
        for queue, prios in sorted(self.groups.items()):
            for p in sorted(prios, reverse=True):
                for t in self.job_types:
                    have = [own.get((queue, t, p)) for lane, own in self._lanes.items()
                            if t in self._serves.get(lane, ())]
                    known = [floor for floor in have if floor is not None]
                    low = min(known) if known and len(known) == len(have) else (None, None)
                    out["queues"].append(queue)
                    out["arm_types"].append(t)
                    out["priorities"].append(p)
                    out["floors"].append(low[0])
                    out["floor_ids"].append(low[1])
        return out

    def seen(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """What a look found (`waiting_queues`, `waiting_after`): where the
        first waiting job of each place is, for `arms` to order the types."""
        self._heads = {(r["queue"], r["job_type"], r["priority"]): (r["run_at"], NIL)
                       for r in rows}

    def drained(self, queue: str, job_types: list[str], rows: Iterable[Any]) -> bool:
        """Whether a claim that returned `rows` (its jobs and `Place`s) left
        nothing due of the lane's types in `queue`, as far as the worker
        knows: no arm has a next job (each floor it returned names none),
        and the last look found no job waiting there in a place the claim
        had no arm for."""
        taken: set[tuple[str, int]] = set()
        for job in rows:
            if job.floor_id is not None:
                return False
            taken.add((job.job_type, job.priority))
        return not any(q == queue and t in job_types and (t, p) not in taken
                       for q, t, p in self._heads)

    def discovered(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """What a look from the front found: the places with waiting jobs of
        this worker's types and the earliest of each, which no floor of
        that type may be past."""
        for row in rows:
            self.lower(row["queue"], row["priority"], row["run_at"], job_type=row["job_type"])


def _from_epoch(text: str) -> dt.datetime:
    """Exact microseconds from PostgreSQL's `extract(epoch ...)` text (a
    float would round, and a floor one microsecond late hides a job)."""
    whole, _, fraction = text.partition(".")
    micros = int((fraction + "000000")[:6]) if fraction else 0
    seconds = int(whole)
    if whole.startswith("-") and micros:
        return _EPOCH + dt.timedelta(seconds=seconds, microseconds=-micros)
    return _EPOCH + dt.timedelta(seconds=seconds, microseconds=micros)
