"""How a worker wakes its idle lanes.

News that jobs wait in a queue (a notification, `floors.py`) wakes *one*
idle lane that serves that queue, of each kind of lane (the async lanes, the
thread lane: they run different job types and the news does not say which
type waits). Waking every lane for one job made the others claim nothing, side
by side with the one that ran it, in the same event loop: round trips that
a lone job's latency paid for. The woken lane wakes the next when its batch
shows more jobs due than it took (`Lane._next_batch`), so a flood still
reaches every lane within a batch.

A stop, a change of the queues' settings, jobs that must run alone, the end
of a batch in burst mode: those concern every lane, and wake them all.

A ring that finds no lane of a kind waiting is kept: the next lane to wait
returns at once, since it may have looked before the jobs were committed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Collection, Hashable


class Doorbell:
    """The idle lanes of one worker, and the rings that reached none of a kind."""

    def __init__(self) -> None:
        #: Waiting lanes, longest-waiting first: (the queues it serves, None
        #: for every queue; its kind; the future its wait ends on).
        self._waiting: list[tuple[Collection[str] | None, Hashable, asyncio.Future[None]]] = []
        self._kinds: set[Hashable] = set()
        #: Rings no lane of a kind heard: (kind, queue; None for every queue).
        self._missed: set[tuple[Hashable, str | None]] = set()

    @property
    def waiting(self) -> int:
        """How many lanes are waiting now."""
        return len(self._waiting)

    def join(self, kind: Hashable) -> None:
        """A lane of `kind` works here (rings must reach each kind)."""
        self._kinds.add(kind)

    def clear(self, serves: Collection[str] | None, kind: Hashable) -> None:
        """A lane is about to look for work: the rings it would hear are
        answered by that look."""
        if self._missed:  # every turn of every lane comes here: usually nothing to drop
            self._missed = {(k, q) for k, q in self._missed
                            if k != kind or not _hears(serves, q)}

    def ring(self, queue: str | None = None) -> None:
        """Jobs wait in `queue`: wake one waiting lane of each kind that serves
        it. None: wake every lane."""
        woken: set[Hashable] = set()
        for entry in list(self._waiting):
            serves, kind, future = entry
            if queue is not None and (kind in woken or not _hears(serves, queue)):
                continue
            woken.add(kind)
            self._waiting.remove(entry)
            if not future.done():
                future.set_result(None)
        self._missed.update((kind, queue) for kind in self._kinds
                            if queue is None or kind not in woken)

    async def wait(self, timeout: float, serves: Collection[str] | None,
                   kind: Hashable) -> None:
        """Sleep until rung (or `timeout` seconds); at once if a ring this
        lane would hear reached no lane of its kind."""
        if any(k == kind and _hears(serves, q) for k, q in self._missed):
            return
        entry = (serves, kind, asyncio.get_running_loop().create_future())
        self._waiting.append(entry)
        try:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(entry[2]), timeout)
        finally:
            if entry in self._waiting:
                self._waiting.remove(entry)


def _hears(serves: Collection[str] | None, queue: str | None) -> bool:
    """Does a lane serving `serves` (None: every queue) hear of `queue` (None: everything)?"""
    return queue is None or serves is None or queue in serves
