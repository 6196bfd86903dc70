"""Recurring jobs, enqueued by the maintenance leader (`upkeep.Leader`), one
job per tick however many workers run.

Each schedule has a row in `jobqueue_schedules` holding the last tick
enqueued for it. Every upkeep tick the leader reads the database's clock,
works out each schedule's latest tick at or before it (`schedules.py`), and,
for those newer than the tick it last saw enqueued, runs `schedule_fire`: one
statement that advances the row's `last_tick` only if it is older and
inserts the tick's job with it. Which worker leads, or whether two briefly
believe they do (a leader change in mid-tick), does not matter: the row,
not the lock, decides, and the job and the row's advance commit together.

Only the latest tick is ever enqueued: ticks missed while no worker ran, or
while the leader was held up, are run once (for the latest of them) rather
than once each. A new schedule starts at its latest tick, so its first job
comes at its next tick, not at once. The leader knows only the schedules its
own registry has: a worker that does not import the module registering one
never fires it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime

import asyncpg

from jobqueue.schedules import ScheduleSpec, tick_text
from jobqueue.schema.queries import queries

logger = logging.getLogger("jobqueue.maintenance")

#: Schedules that tick faster than this (seconds) log each job at DEBUG, not INFO.
QUIET_BELOW = 60


class Scheduler:
    """The recurring jobs of one leader's registry, for one life of its worker."""

    def __init__(self, schedules: Mapping[str, ScheduleSpec]) -> None:
        self.schedules = dict(schedules)  # as registered when the life began
        self.registered = False
        #: Each schedule's newest tick known to be enqueued (by any leader):
        #: only a newer tick is worth a statement.
        self.done: dict[str, datetime] = {}
        #: Each schedule's latest and next tick as last computed; recomputed
        #: only once the next one has come (a cron evaluation costs 20 to
        #: 800 µs, twice a second per schedule otherwise).
        self._windows: dict[str, tuple[datetime | None, datetime | None]] = {}

    async def run_once(self, conn: asyncpg.Connection, now: datetime | None = None) -> int:
        """Enqueue the ticks that are due; how many jobs that made. `now`
        stands in for the database's clock (tests, notebooks)."""
        if not self.schedules:
            return 0
        if now is None:
            now = await queries["schedule_clock"].fetchval(conn)
        assert now is not None
        ticks = {job_type: self.latest_tick(job_type, now) for job_type in self.schedules}
        if not self.registered:
            await self._register(conn, ticks, now)
        due = {job_type: tick for job_type, tick in ticks.items()
               if tick is not None and (job_type not in self.done or tick > self.done[job_type])}
        if not due:
            return 0
        specs = [self.schedules[job_type] for job_type in due]
        rows = await queries["schedule_fire"].fetch(
            conn, job_types=list(due), ticks=[tick_text(t) for t in due.values()],
            queues=[s.queue for s in specs], priorities=[s.priority for s in specs])
        self.done.update(due)  # enqueued now, or already by someone else
        for row in rows:
            spec = self.schedules[row["job_type"]]
            quiet = spec.every is not None and spec.every < QUIET_BELOW
            logger.log(logging.DEBUG if quiet else logging.INFO,
                       "enqueued recurring job %s for its tick %s", row["job_type"], row["tick"],
                       extra={"event": "schedule_fired", "job_type": row["job_type"],
                              "tick": row["tick"], "job_id": str(row["id"])})
        return len(rows)

    def latest_tick(self, job_type: str, now: datetime) -> datetime | None:
        latest, following = self._windows.get(job_type, (None, None))
        if job_type not in self._windows or not (
                (latest is None or latest <= now) and (following is None or now < following)):
            spec = self.schedules[job_type]
            latest, following = spec.latest_tick(now), spec.next_tick(now)
            self._windows[job_type] = (latest, following)
        return latest

    async def _register(self, conn: asyncpg.Connection, ticks: Mapping[str, datetime | None],
                        now: datetime) -> None:
        """Write this leader's schedules (new ones from their latest tick) and
        learn each one's last tick."""
        rows = await queries["schedule_register"].fetch(
            conn, job_types=list(self.schedules),
            schedules=[s.text for s in self.schedules.values()],
            ticks=[ticks[job_type] or now for job_type in self.schedules])
        self.done = {row["job_type"]: row["last_tick"] for row in rows}
        self.registered = True
        logger.info("enqueuing the ticks of %d recurring job type(s): %s", len(self.schedules),
                    ", ".join(f"{job_type} ({spec.text})"
                              for job_type, spec in sorted(self.schedules.items())))
