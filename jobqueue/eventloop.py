"""Which event loop a worker runs on.

A lane spends much of each job in the event loop's socket code: every
statement is a round trip, and a job that writes costs one or two. uvloop's
transports are written in C; `python -m jobqueue.benchmarks.ceiling` measures
a round trip on both loops. So `auto` takes uvloop when it is installed (on
Linux and macOS it comes with jobqueue) and the standard loop otherwise.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

LOOPS = ("auto", "asyncio", "uvloop")


def loop_factory(choice: str = "auto") -> Callable[[], asyncio.AbstractEventLoop] | None:
    """A factory for `asyncio.Runner(loop_factory=…)`; None: the standard loop.
    Raises ImportError for "uvloop" when it is not installed."""
    if choice not in LOOPS:
        raise ValueError(f"event loop must be one of {', '.join(LOOPS)}, not {choice!r}")
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise
        return None
    return uvloop.new_event_loop  # type: ignore[no-any-return]
