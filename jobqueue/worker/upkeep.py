"""Upkeep every worker does, tick by tick, in two loops on two connections of
their own, so that neither ever waits for the other:

- `Heartbeat`, on the *heartbeat* connection: prove this worker is alive (the
  lease others judge it by), and fence off workers whose heartbeat is older
  than the lease, whatever their role, so a hung active worker cannot block
  the queue for more than a lease (any worker may do it, and doing it twice
  is harmless); the jobs of those it fenced are rescued at once.
- `Leader`, on the *monitor* connection (shared with the runner's hand-backs,
  under its lock): contest the maintenance leader's lock, and, as leader,
  return the jobs of dead workers to the queue (rescue), enqueue the ticks of
  recurring jobs that are due (`scheduler.py`), move finished jobs from
  `jobs` to the history a slice per tick (archive), and drop the history's
  days past their retention (expire, a partition at a time).

Every statement on these connections gives up after the config's
`statement_timeout`, half the lease: a chore stuck behind a lock fails and
is tried again later instead of holding a connection indefinitely, and a
slow one can no longer delay this worker's own heartbeat, which used to
share its connection and lock. Each chore is one statement of `queries.sql`;
`run_once()` does one tick, so tests and notebooks can drive it step by step.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

import asyncpg

from jobqueue import db
from jobqueue.errors import is_connection_error, one_line
from jobqueue.retry import RetryPolicy
from jobqueue.schedules import ScheduleSpec
from jobqueue.schema.locks import LEADER_KEY, LOCK_CLASS, WORKER_LOCK_CLASS
from jobqueue.schema.queries import queries
from jobqueue.worker.config import WorkerConfig
from jobqueue.worker.scheduler import Scheduler
from jobqueue.worker.stats import WorkerStats

logger = logging.getLogger("jobqueue.maintenance")
T = TypeVar("T")

DEFAULT_POLICY = RetryPolicy()
ARCHIVE_SLICE = 10_000  # most finished jobs one tick moves to the history; a full
# slice means more are waiting, so the next tick moves again
ARCHIVE_IDLE = 5.0  # after a slice that was not full, seconds until the next look
EXPIRE_EVERY = 60.0  # seconds between looks for history days past retention, and
# between slices taken from the front of the finished jobs, not from where the last one ended
FRONT = datetime.min.replace(tzinfo=UTC)  # before any completion


class Fenced(Exception):
    """This worker's heartbeat row is gone: another worker declared it hung."""


async def connect(url: str, application_name: str, config: WorkerConfig) -> asyncpg.Connection:
    """A dedicated upkeep connection whose statements give up after
    `config.statement_timeout` (below the lease), and whose client gives up
    on a statement the server has not answered within the lease: a server
    that froze or was cut off without a word (no TCP reset) would otherwise
    hold the heartbeat, and so the worker, forever. That timeout ends the
    worker's life, which cuts its other connections and starts over on the
    server the URL leads to now (after a failover, the promoted standby).

    Its commits wait for the local disk only (`synchronous_commit = local`,
    the same as `on` without a synchronous standby): with one, a standby
    that is down would hold every heartbeat (a statement timeout does not
    end that wait), and the worker would start over and over, each life
    leaving its backends waiting. Nothing upkeep writes needs a standby's
    copy: a heartbeat, a registration, a rescue, a hand-back, a move to the
    history or a fired tick that a failover loses is done again by the next
    tick or life, and a job's claim or completion, committed synchronously,
    carries every earlier commit of the primary with it to the standby."""
    timeout_ms = max(1, int(config.statement_timeout * 1000))
    return await db.connect(url, application_name=application_name,
                            settings={"statement_timeout": f"{timeout_ms}ms",
                                      "synchronous_commit": "local"},
                            command_timeout=config.lease)


async def rescue(conn: asyncpg.Connection, policy: RetryPolicy = DEFAULT_POLICY) -> int:
    """Jobs of dead workers back to the queue; how many. A job its worker
    died running alone has that attempt counted (retried after `policy`'s
    backoff, without jitter, or failed for good); the others go back
    uncounted; all of them run alone next time (`queries.sql: rescue`).
    Connections the dead left behind are ended first (`reap`)."""
    await queries["reap"].fetch(conn, worker_lock_class=WORKER_LOCK_CLASS)
    row = await queries["rescue"].fetchrow(
        conn, worker_lock_class=WORKER_LOCK_CLASS, base=policy.base, factor=policy.factor,
        cap=policy.cap)
    if row is None or not row["n"]:
        return 0
    if row["counted"]:
        logger.warning("%d job(s) took their worker down (each was all it ran): the attempt "
                       "counts, %d of them failed for good", row["counted"], row["failed"],
                       extra={"event": "jobs_lost_with_worker", "jobs": row["counted"],
                              "failed": row["failed"]})
    return int(row["n"])


async def fence(conn: asyncpg.Connection, lease: float, self_id: int) -> list[tuple[int, int]]:
    """Workers whose lease ran out, cut off: [(worker id, backends terminated)].
    Crashed workers (no liveness lock) are forgotten on the way, silently."""
    rows = await queries["fence"].fetch(
        conn, lease=lease, self_id=self_id, worker_lock_class=WORKER_LOCK_CLASS)
    return [(r["id"], r["terminated"]) for r in rows if r["hung"]]


async def archive(conn: asyncpg.Connection, config: WorkerConfig,
                  since: datetime | None = None) -> tuple[int, datetime | None]:
    """Move the oldest slice of jobs finished `config.archive_after` seconds
    ago (none before `since`; None: from the front) to the history (those
    already past retention: deleted): how many left `jobs`, and the latest
    completion among them (where the next slice can start). The days they
    finished on get their partitions first. A look from the front always
    runs the move, which forgets dead waiters on the way; any other look
    that finds nothing to move stops at the one small read."""
    params = {"after": config.archive_after, "keep_completed": config.keep_completed,
              "keep_failed": config.keep_failed, "limit": ARCHIVE_SLICE,
              "since": since or FRONT}
    window = await queries["archive_days"].fetchrow(conn, **params)
    assert window is not None  # an aggregate: always a row
    if window["first_day"] is not None:
        await queries["history_add"].fetch(conn, first_day=window["first_day"],
                                           last_day=window["last_day"])
    if window["upto"] is None and since is not None:
        return 0, None  # nothing to move: the statement waits for a look from the front
    # From the front it runs even with nothing to move: it forgets dead waiters too.
    row = await queries["archive"].fetchrow(conn, **params, upto=window["upto"] or FRONT)
    return (int(row["moved"]), row["reached"]) if row else (0, None)


async def expire(conn: asyncpg.Connection, config: WorkerConfig) -> int:
    """Drop the history's partitions whose whole day is past retention; how
    many. Each in a transaction of its own: one whose lock is not had at
    once (a long read of the history) is left for the next pass."""
    dropped = 0
    for row in await queries["history_expired"].fetch(
            conn, keep_completed=config.keep_completed, keep_failed=config.keep_failed):
        try:
            dropped += bool(await queries["history_drop"].fetchval(
                conn, status=row["status"], day=row["day"]))
        except asyncpg.LockNotAvailableError:
            logger.info("history of %s jobs of %s not dropped yet: in use",
                        row["status"], row["day"])
    return dropped


def _note_rescued(rescued: int, stats: WorkerStats) -> None:
    if rescued:
        stats.rescued += rescued
        logger.warning("returned %d job(s) of dead workers to the queue", rescued)


async def _every_tick(chore: Callable[[], Awaitable[Any]], tick: float) -> None:
    """Run `chore` every `tick` seconds until cancelled. Being fenced or
    losing the connection ends the worker's life; any other error (a
    permission, a statement timeout) is logged and the next tick tries again:
    upkeep must not take the worker down."""
    while True:
        try:
            await chore()
        except Fenced:
            raise
        except Exception as exc:
            if is_connection_error(exc):
                raise
            logger.error("upkeep failed (%s); trying again next tick", one_line(exc))
        await asyncio.sleep(tick)


class Heartbeat:
    """Heartbeat and fencing, for one life of one worker."""

    def __init__(self, config: WorkerConfig, conn: asyncpg.Connection, worker_id: int,
                 role: Callable[[], str], stats: WorkerStats) -> None:
        self.config = config
        self.conn = conn
        self.worker_id = worker_id
        self.role = role  # the state to report: standby, active or shared
        self.stats = stats

    async def run_forever(self) -> None:
        await _every_tick(self.run_once, self.config.tick)

    async def run_once(self) -> dict[str, Any]:
        alive = await queries["heartbeat"].fetchval(self.conn, id=self.worker_id,
                                                    state=self.role())
        if alive is None:
            raise Fenced(f"worker {self.worker_id} was fenced off (its lease ran out)")
        lease = self.config.lease
        fenced = await fence(self.conn, lease, self.worker_id)
        for worker_id, terminated in fenced:
            logger.warning("fenced off worker %d (heartbeat older than %.1fs): "
                           "%d connection(s) terminated", worker_id, lease, terminated)
        rescued = await rescue(self.conn, self.config.retry_policy) if fenced else 0
        _note_rescued(rescued, self.stats)
        return {"fenced": fenced, "rescued": rescued}


class Leader:
    """The maintenance leader's chores (rescue, recurring jobs, history), for
    one life of one worker; every worker contests the lock, one holds it.
    `schedules`: the recurring jobs of the worker's registry, which only the
    leader enqueues."""

    def __init__(self, config: WorkerConfig, conn: asyncpg.Connection, worker_id: int,
                 stats: WorkerStats, lock: asyncio.Lock,
                 schedules: Mapping[str, ScheduleSpec] | None = None) -> None:
        self.config = config
        self.conn = conn
        self.worker_id = worker_id
        self.stats = stats
        self.lock = lock  # the connection's: the runner hands jobs back on it too
        self.scheduler = Scheduler(schedules or {})
        self.leader = False
        self.last_expire = 0.0
        self.archived_to: datetime | None = None  # where the last slice ended
        self.next_archive = 0.0  # when to look for finished jobs to move next

    async def run_forever(self) -> None:
        await _every_tick(self.run_once, self.config.tick)

    async def run_once(self) -> dict[str, Any]:
        config = self.config
        rescued = scheduled = archived = expired = 0
        async with self.lock:
            if not self.leader:
                self.leader = bool(await queries["try_lock"].fetchval(
                    self.conn, lock_class=LOCK_CLASS, key=LEADER_KEY))
                if self.leader:
                    logger.info("worker %d leads maintenance", self.worker_id)
            if self.leader:
                rescued = await rescue(self.conn, config.retry_policy)
                scheduled = await self._guarded(self.scheduler.run_once(self.conn), 0,
                                                "recurring jobs not enqueued")
                archived, expired = await self._history()
        _note_rescued(rescued, self.stats)
        if archived:
            logger.debug("moved %d finished job(s) to the history", archived)
        if expired:
            logger.info("dropped %d day(s) of history past retention", expired)
        return {"leader": self.leader, "rescued": rescued, "scheduled": scheduled,
                "archived": archived, "expired": expired}

    async def _history(self) -> tuple[int, int]:
        """Finished jobs moved to the history (when a look is due: every tick
        while slices are full, else every ARCHIVE_IDLE s; from where the last
        slice ended, or from the front once a minute), and days of history
        dropped past retention (once a minute). The next look is set before
        this one runs, so a look that fails (a statement timeout) waits its
        turn like any other, from where the last good slice ended, instead
        of running from the front every tick; neither chore's failure holds
        up the other."""
        now = asyncio.get_running_loop().time()
        front = now - self.last_expire >= EXPIRE_EVERY
        archived = expired = 0
        if front:
            self.last_expire = now
        if front or now >= self.next_archive:
            self.next_archive = now + ARCHIVE_IDLE
            archived, reached = await self._guarded(
                archive(self.conn, self.config, None if front else self.archived_to or FRONT),
                (0, None), "finished jobs not moved to the history")
            self.archived_to = reached or self.archived_to
            if archived >= ARCHIVE_SLICE:  # more are waiting: the next tick goes on
                self.next_archive = now
        if front:
            expired = await self._guarded(expire(self.conn, self.config), 0,
                                          "history past retention not dropped")
        return archived, expired

    async def _guarded(self, chore: Awaitable[T], failed: T, what: str) -> T:
        """A chore's result; `failed` when it fails (a statement timeout, a
        permission), logged, so that the chores after it still run this
        tick. A lost connection ends the life, as everywhere."""
        try:
            return await chore
        except Exception as exc:
            if is_connection_error(exc):
                raise
            logger.error("%s (%s); trying again later", what, one_line(exc))
            return failed
