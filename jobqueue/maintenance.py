"""Upkeep every worker does on its monitor connection, tick by tick.

- heartbeat: prove this worker is alive (the lease others judge it by);
- fence: cut off workers whose heartbeat is older than the lease, whatever
  their role, so a hung active worker cannot block the queue for more than a
  lease; any worker may do it, and doing it twice is harmless;
- rescue: return the jobs of dead or fenced workers to the queue;
- prune: delete finished jobs past their retention (the leader only).

Each chore is one statement of `queries.sql`; `run_once()` does one tick, so
tests and notebooks can drive it step by step.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import asyncpg

from jobqueue.errors import is_connection_error, one_line
from jobqueue.schema.locks import LEADER_KEY, LOCK_CLASS, WORKER_LOCK_CLASS
from jobqueue.schema.queries import queries

if TYPE_CHECKING:
    from jobqueue.worker import JobRunner

logger = logging.getLogger("jobqueue.maintenance")

PRUNE_EVERY = 60.0  # seconds between pruning passes that find little to do
PRUNE_SLICE = 10_000  # most jobs one pruning statement deletes; a full slice
# means more are waiting, so the next tick prunes again instead of a minute later


class Fenced(Exception):
    """This worker's heartbeat row is gone: another worker declared it hung."""


async def rescue(conn: asyncpg.Connection) -> int:
    """Jobs of dead workers back to the queue; how many."""
    row = await queries["rescue"].fetchrow(conn, worker_lock_class=WORKER_LOCK_CLASS)
    return int(row["n"]) if row else 0


async def fence(conn: asyncpg.Connection, lease: float, self_id: int) -> list[tuple[int, int]]:
    """Workers whose lease ran out, cut off: [(worker id, backends terminated)].
    Crashed workers (no liveness lock) are forgotten on the way, silently."""
    rows = await queries["fence"].fetch(
        conn, lease=lease, self_id=self_id, worker_lock_class=WORKER_LOCK_CLASS)
    return [(r["id"], r["terminated"]) for r in rows if r["hung"]]


async def prune(conn: asyncpg.Connection, keep_completed: float, keep_failed: float) -> int:
    status = await queries["prune"].execute(
        conn, keep_completed=keep_completed, keep_failed=keep_failed, limit=PRUNE_SLICE)
    return int(status.split()[-1])


@dataclass
class Upkeep:
    """The monitor connection's loop, for one life of one worker."""

    runner: JobRunner
    conn: asyncpg.Connection
    leader: bool = False
    last_prune: float = 0.0

    async def run_forever(self) -> None:
        """Tick until cancelled. Being fenced or losing the connection ends the
        worker's life; any other error (a permission, a timeout) is logged and
        the next tick tries again: upkeep must not take the worker down."""
        while True:
            try:
                await self.run_once()
            except Fenced:
                raise
            except Exception as exc:
                if is_connection_error(exc):
                    raise
                logger.error("upkeep failed (%s); trying again next tick", one_line(exc))
            await asyncio.sleep(self.runner.tick)

    async def run_once(self) -> dict[str, Any]:
        runner = self.runner
        async with runner.monitor_lock:
            alive = await queries["heartbeat"].fetchval(
                self.conn, id=runner.worker_id, state=runner.role)
            if alive is None:
                raise Fenced(f"worker {runner.worker_id} was fenced off (its lease ran out)")
            fenced = await fence(self.conn, runner.lease, runner.worker_id)
            for worker_id, terminated in fenced:
                logger.warning("fenced off worker %d (heartbeat older than %.1fs): "
                               "%d connection(s) terminated", worker_id, runner.lease, terminated)
            if not self.leader:
                self.leader = bool(await queries["try_lock"].fetchval(
                    self.conn, lock_class=LOCK_CLASS, key=LEADER_KEY))
                if self.leader:
                    logger.info("worker %d leads maintenance", runner.worker_id)
            rescued = await rescue(self.conn) if self.leader or fenced else 0
            pruned = 0
            now = asyncio.get_running_loop().time()
            if self.leader and now - self.last_prune >= PRUNE_EVERY:
                self.last_prune = now  # a pass that fails waits its minute too
                pruned = await prune(self.conn, runner.keep_completed, runner.keep_failed)
                if pruned >= PRUNE_SLICE:
                    self.last_prune = now - PRUNE_EVERY
        if rescued:
            runner.stats.rescued += rescued
            logger.warning("returned %d job(s) of dead workers to the queue", rescued)
        if pruned:
            logger.info("pruned %d finished job(s) past retention", pruned)
        return {"fenced": fenced, "rescued": rescued, "pruned": pruned, "leader": self.leader}
