"""What a worker knows about the queues: which have waiting jobs, and which
are paused or limited. Shared by its lanes, read fresh from the database.

Knowing is only for choosing: the claim statements themselves check the
settings against the committed `jobqueue_queues` table (`queries.sql`), so a
worker that has not heard of a pause yet still takes nothing from the paused
queue. A stale book costs a lane an empty claim, never a broken limit.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import time
from typing import Any, NamedTuple

from jobqueue.schema.queries import queries
from jobqueue.worker.floors import DISCOVER_INTERVAL, Floors

#: Payload of the notification sent when a queue's settings change.
SETTINGS_CHANGED = "queues"


class Settings(NamedTuple):
    paused: bool
    limited: bool


class QueueBook:
    """The queues seen by one worker (all its lanes), refreshed by the lanes
    on their own connections when they run out of work, and the settings at
    least every `poll_interval` or as soon as a change is announced."""

    def __init__(self, poll_interval: float) -> None:
        self.poll_interval = poll_interval
        #: Queue -> seconds until its earliest waiting job is due, at the last look.
        self.waiting: dict[str, float] = {}
        self.settings: dict[str, Settings] = {}
        self.settings_read_at = -float("inf")
        #: One read at a time: a lane that needs the settings while another
        #: reads them waits for that read instead of going on without them
        #: (at start, it would take a limited queue for a plain one).
        self._reading = asyncio.Lock()
        #: Bumped by every change notification: a read that began before one
        #: does not count as fresh.
        self._changes = 0
        #: Queues announced since the last look began (`heard`): a look whose
        #: snapshot came before the announcing commit must not forget them.
        self._news: dict[str, float] = {}

    def settings_changed(self) -> None:
        """A notification said a queue was paused, resumed or limited."""
        self._changes += 1
        self.settings_read_at = -float("inf")

    def heard(self, queue: str, at: dt.datetime) -> None:
        """A notification said jobs wait in `queue` from `at` on: the lanes
        try it on their next turn without looking first (a look is a round
        trip, and after a lone job's NOTIFY it only found what was said)."""
        due_in = max(0.0, (at - dt.datetime.now(dt.UTC)).total_seconds())
        for seen in (self.waiting, self._news):
            seen[queue] = min(due_in, seen.get(queue, math.inf))

    def _fresh(self) -> bool:
        return time.monotonic() - self.settings_read_at < self.poll_interval

    def known(self) -> list[str]:
        """Queues with waiting jobs at the last look, in name order."""
        return list(self.waiting)

    def paused(self, queue: str) -> bool:
        s = self.settings.get(queue)
        return s is not None and s.paused

    def limited(self, queue: str) -> bool:
        s = self.settings.get(queue)
        return s is not None and s.limited

    async def read_settings(self, raw: Any) -> None:
        """Reread the settings if they may be stale (every poll interval, or
        after a change was announced)."""
        if self._fresh():
            return
        async with self._reading:
            if self._fresh():
                return  # another lane read them while this one waited
            changes, started = self._changes, time.monotonic()
            rows = await queries["queue_settings"].fetch(raw)
            self.settings = {
                r["name"]: Settings(r["paused"], r["concurrency"] is not None
                                    or r["rate_limit"] is not None)
                for r in rows}
            if changes == self._changes:
                self.settings_read_at = started

    async def look(self, raw: Any, floors: Floors) -> None:
        """Which queues have waiting jobs, and when each is due next: past
        the lanes' floors, or from the front of the index when a life has
        not looked there yet or not for DISCOVER_INTERVAL (`floors.py`)."""
        now = time.monotonic()
        self._news = {}
        if floors.discovered_at is None or now - floors.discovered_at >= DISCOVER_INTERVAL:
            floors.discovered_at = now
            rows = await queries["waiting_queues"].fetch(raw, job_types=floors.job_types)
            floors.discovered(rows)
        else:
            rows = await queries["waiting_after"].fetch(raw, **floors.lowest())
        floors.seen(rows)
        waiting = dict(self._news)
        for r in rows:
            waiting[r["queue"]] = min(r["due_in"], waiting.get(r["queue"], math.inf))
        self.waiting = waiting
        await self.read_settings(raw)

    def due_in(self, served: tuple[str, ...] | None) -> float | None:
        """Seconds until the earliest waiting job of `served` (None: every
        queue) is due, paused queues left out; None: nothing waits. A lower
        bound for sleeping: it counts jobs of every type."""
        times = [due for queue, due in self.waiting.items()
                 if (served is None or queue in served) and not self.paused(queue)]
        return min(times) if times else None
