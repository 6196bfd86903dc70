"""Running a job alone: with nothing else running in the worker.

A worker that dies while running several jobs (a segfault, the OOM killer,
a hang that gets it fenced) leaves no clue which of them killed it. Blaming
them all would spend the retries of innocent jobs; blaming none would let a
job that kills every worker that runs it come back forever. So the rescue
blames none and marks them all `run_alone` (`queries.sql: rescue`), and a
worker runs each of those with nothing beside it: if it dies then, the job
is the cause and its attempt counts; the innocent ones simply complete.

`AloneGate` is how a worker's lanes make room: one lane (the soloist)
closes the gate, waits for the other lanes' batches to end, runs the jobs
that must run alone one at a time, and opens the gate again. The others
wait at the gate before their next batch. A soloist is wanted when the
rescue announces such jobs (`NOTIFY jobqueue, 'alone'`), when the worker
starts, when one of them becomes due (the soloist sets a timer), and
whenever a lane finds nothing else to do.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

#: The payload of the notification that announces jobs that must run alone.
ALONE = "alone"


class AloneGate:
    """One worker's lanes taking turns with its soloist (one life's)."""

    def __init__(self) -> None:
        #: Jobs that must run alone may be due: the next lane to start a batch
        #: becomes the soloist and looks.
        self.wanted = True
        self.soloist: int | None = None
        self._open = asyncio.Event()
        self._open.set()
        self._busy = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._timer: asyncio.TimerHandle | None = None
        self._looked = -float("inf")  # when a lane last asked the database

    def want(self) -> None:
        self.wanted = True

    def look(self, every: float) -> bool:
        """Should a lane with nothing else to do ask the database now? When
        wanted, or at most once per `every` seconds (idle lanes wake often)."""
        now = asyncio.get_running_loop().time()
        if self.wanted or now - self._looked >= every:
            self._looked = now
            return True
        return False

    def want_in(self, seconds: float | None) -> None:
        """Look again in `seconds` (None: when told)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if seconds is not None:
            self._timer = asyncio.get_running_loop().call_later(max(0.0, seconds), self.want)

    @contextlib.asynccontextmanager
    async def batch(self) -> AsyncIterator[None]:
        """Around a lane's ordinary batch: waits while a soloist runs."""
        await self._open.wait()
        self._busy += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._busy -= 1
            if not self._busy:
                self._idle.set()

    @contextlib.asynccontextmanager
    async def alone(self, lane: int) -> AsyncIterator[bool]:
        """Become the soloist (True once every other batch has ended), or
        not (False: another lane is, or nothing is wanted)."""
        if self.soloist is not None:
            yield False
            return
        self.soloist = lane
        self._open.clear()
        try:
            await self._idle.wait()
            yield True
        finally:
            self.soloist = None
            self._open.set()

    def close(self) -> None:
        self.want_in(None)
