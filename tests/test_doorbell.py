"""The doorbell: which idle lanes a ring wakes (no database needed)."""

from __future__ import annotations

import asyncio

from jobqueue.worker.doorbell import Doorbell

ASYNC, SYNC = ("noop", "write"), ("noop_sync",)


async def waiting(bell: Doorbell, *lanes: tuple[tuple[str, ...] | None, object]
                  ) -> list[asyncio.Task[None]]:
    """One task per lane (serves, kind), each waiting on `bell`, all of them in."""
    tasks = [asyncio.create_task(bell.wait(60, serves, kind)) for serves, kind in lanes]
    while bell.waiting < len(tasks):
        await asyncio.sleep(0)
    return tasks


async def woken(tasks: list[asyncio.Task[None]]) -> list[bool]:
    for _ in range(5):
        await asyncio.sleep(0)
    return [task.done() for task in tasks]


async def test_news_of_a_queue_wakes_one_idle_lane_of_each_kind() -> None:
    bell = Doorbell()
    for kind in (ASYNC, SYNC):
        bell.join(kind)
    tasks = await waiting(bell, (None, ASYNC), (None, ASYNC), (None, SYNC))
    bell.ring("default")
    assert await woken(tasks) == [True, False, True]  # the longest-waiting async lane
    bell.ring("default")
    assert await woken(tasks) == [True, True, True]


async def test_a_lane_that_does_not_serve_the_queue_sleeps_on() -> None:
    bell = Doorbell()
    bell.join(ASYNC)
    tasks = await waiting(bell, (("emails",), ASYNC), (("reports",), ASYNC))
    bell.ring("reports")
    assert await woken(tasks) == [False, True]
    bell.ring()  # a stop, a change of settings: every lane
    assert await woken(tasks) == [True, True]


async def test_a_ring_no_lane_of_a_kind_heard_is_kept_for_the_next_that_would() -> None:
    """A lane that looked before the jobs were committed, and waits only
    after their news came, must not sleep through it."""
    bell = Doorbell()
    for kind in (ASYNC, SYNC):
        bell.join(kind)
    (sync_lane,) = await waiting(bell, (None, SYNC))
    bell.ring("emails")  # the sync lane hears it; no async lane was waiting
    assert await woken([sync_lane]) == [True]
    # An async lane serving other queues only: the news is not for it.
    (other,) = await waiting(bell, (("reports",), ASYNC))
    assert await woken([other]) == [False]
    # One that serves "emails" returns at once, and its look answers the news.
    await asyncio.wait_for(bell.wait(60, ("emails",), ASYNC), 1)
    bell.clear(("emails",), ASYNC)
    (later,) = await waiting(bell, (("emails",), ASYNC))
    assert await woken([later, other]) == [False, False]
    bell.ring()
    assert await woken([later, other]) == [True, True]
